"""Structured JSON logs for every framespool process, with secrets redacted.

Log lines never carry API keys, bearer tokens or signed URLs: values that
look like them are masked before the line is written.
"""
from __future__ import annotations

import json
import logging
import re
import sys
import time

_SECRETS = re.compile(r"(Bearer\s+)\S+|([?&](?:sig|signature|X-Amz-Signature|X-Amz-Credential)=)"
                      r"[^&\s\"']+", re.IGNORECASE)
_STANDARD = set(vars(logging.makeLogRecord({})))


def redact(text: str) -> str:
    return _SECRETS.sub(lambda m: (m.group(1) or m.group(2)) + "***", text)


class JsonFormatter(logging.Formatter):
    def __init__(self, process: str) -> None:
        super().__init__()
        self.process = process

    def format(self, record: logging.LogRecord) -> str:
        line = {"ts": round(time.time(), 3), "level": record.levelname.lower(),
                "process": self.process, "logger": record.name,
                "msg": redact(record.getMessage())}
        for key, value in vars(record).items():
            if key not in _STANDARD and key not in line:
                line[key] = redact(str(value)) if isinstance(value, str) else value
        if record.exc_info:
            line["exc"] = redact(self.formatException(record.exc_info))
        return json.dumps(line, default=str)


def configure_json_logging(process: str, level: int = logging.INFO) -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter(process))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level)
    logging.getLogger("aiohttp.access").setLevel(logging.WARNING)
