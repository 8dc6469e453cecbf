"""The one definition of each pattern the HTTP API checks, for validation and the OpenAPI document.

Patterns are written unanchored. The API matches them with ``re.fullmatch``
(``$`` would let a trailing newline through); ``schema(p)`` anchors one for a
JSON Schema ``pattern``, which is searched, not matched.
"""

from __future__ import annotations

NAME = r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}"  # model, model version, GPU type
PARAM_KEY = r"[a-z][a-z0-9_]{0,63}"
RESOLUTION = r"([0-9]{1,5})x([0-9]{1,5})"  # WIDTHxHEIGHT
CURSOR = r"[0-9]{13}/[A-Za-z0-9._:-]{1,128}"
IDEMPOTENCY_KEY = r"[\x21-\x7e]{1,255}"
DIGITS = r"[0-9]+"

# What users commonly send instead of WIDTHxHEIGHT, and what each means (16:9).
RESOLUTION_PRESETS = {
    "360p": "640x360",
    "480p": "854x480",
    "540p": "960x540",
    "720p": "1280x720",
    "1080p": "1920x1080",
    "1440p": "2560x1440",
    "2160p": "3840x2160",
    "4k": "3840x2160",
}


def schema(pattern: str) -> str:
    """``pattern`` anchored at both ends, for a JSON Schema (ECMA-262) ``pattern``."""
    return f"^{pattern}$"
