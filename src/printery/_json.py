"""One JSON codec for the whole project (orjson: decode once, encode fast)."""

from __future__ import annotations

from typing import Any

import orjson

JSONDecodeError = orjson.JSONDecodeError


def dumps(value: Any) -> str:
    return orjson.dumps(value).decode()


def dumpb(value: Any) -> bytes:
    return orjson.dumps(value)


def loads(text: str | bytes) -> Any:
    return orjson.loads(text)


def dumps_indented(value: Any) -> str:
    """For reading, not the wire: two-space indentation."""
    return orjson.dumps(value, option=orjson.OPT_INDENT_2).decode()
