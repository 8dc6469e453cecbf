"""Structured JSON logs for every framespool process, with secrets redacted.

One JSON object per line on stderr: ts, level, logger, msg, the process's
static fields (role, instance, ...) and any ``extra`` fields. Values that look
like bearer tokens, X-API-Key values, URL signatures and URL query strings are
masked before the line is written, so logs never carry API keys, signed URLs or
the tokens receivers put in their callback URLs.
"""

from __future__ import annotations

import json
import logging
import re
import sys
from typing import Any

_SECRETS = re.compile(
    r"(Bearer\s+)\S+|([?&](?:sig|signature|X-Amz-Signature|X-Amz-Credential)=)"
    r"[^&\s\"']+"
    # an X-API-Key header as text, a dict or JSON: its value up to the next quote/space
    r"|(X-API-Key[\"']?\s*[:=]\s*[\"']?)[^\s\"',}]+"
    # any other URL's query string (callback URLs carry receivers' tokens there)
    r"|(https?://[^\s?#\"']+\?)[^\s#\"']+",
    re.IGNORECASE,
)
# Every alternative of _SECRETS starts at one of these (same flags, so the same
# case folding): text without any is returned as is, without running the
# four-way alternation at every position (the common case: ids, topics, states).
_MAYBE_SECRET = re.compile(r"[?&]|bearer|x-api-key", re.IGNORECASE)
_STANDARD = set(vars(logging.LogRecord("", 0, "", 0, "", (), None))) | {"message", "asctime"}


def _mask(text: str) -> str:
    """Every match of the full pattern masked after its kept prefix."""
    return _SECRETS.sub(lambda m: next(g for g in m.groups() if g is not None) + "***", text)


def redact(text: str) -> str:
    """``text`` with its secrets masked. Cost: one scan for a trigger (``?``,
    ``&``, ``bearer``, ``x-api-key``); the full pattern only where one occurs."""
    if _MAYBE_SECRET.search(text) is None:
        return text
    return _mask(text)


class JsonFormatter(logging.Formatter):
    def __init__(self, static: dict[str, Any] | None = None) -> None:
        super().__init__()
        self.static = static or {}

    def format(self, record: logging.LogRecord) -> str:
        doc: dict[str, Any] = {
            "ts": round(record.created, 3),
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": redact(record.getMessage()),
            **self.static,
        }
        for key, value in vars(record).items():
            if key not in _STANDARD and not key.startswith("_") and key not in doc:
                doc[key] = redact(value) if isinstance(value, str) else value
        if record.exc_info:
            doc["exc"] = redact(self.formatException(record.exc_info))
        return json.dumps(doc, default=str)


def setup_logging(level: str = "INFO", **static: Any) -> None:
    """Route the root logger to stderr as JSON lines carrying ``static`` fields.

    The lines carry no caller, thread or process fields, so the records are not
    made to collect them (the logging HOWTO's "Optimization"; ``stack_info``
    is then not filled in, and nothing here asks for it). The processors log a
    line per decision: with this and :func:`redact`'s quick check a scheduler's
    ``JobAssigned`` line costs 16.4-17.9 instead of 21.2-23.6 us
    (``docs/measuring.md#timing-a-log-line``: the script and four runs).
    """
    logging._srcfile = None  # no findCaller: no file, line or function in the lines
    logging.logThreads = False
    logging.logProcesses = False
    logging.logMultiprocessing = False
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter(static))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    logging.getLogger("aiohttp.access").setLevel(logging.WARNING)
