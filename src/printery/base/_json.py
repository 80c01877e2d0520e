"""One JSON codec for the whole project (orjson: decode once, encode fast)."""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

import orjson

JSONDecodeError = orjson.JSONDecodeError

#: What the Redis client decodes bytes that are not UTF-8 to (``surrogateescape``):
#: U+DC80..U+DCFF, and any other lone surrogate a lenient parser let through.
_SURROGATE = re.compile("[\ud800-\udfff]")


def valid_utf8(text: str) -> str:
    """``text`` with every lone surrogate (a byte of a stream entry that was not UTF-8)
    shown as U+FFFD, as any UTF-8 reader of the raw bytes would show it: such a string
    cannot be encoded to UTF-8, and one byte of garbage in an entry must not fail the
    page, answer or ``--json`` document that shows it."""
    return _SURROGATE.sub("\ufffd", text)


def _valid(value: Any) -> Any:
    if isinstance(value, str):
        return valid_utf8(value)
    if isinstance(value, dict):
        return {_valid(k): _valid(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_valid(v) for v in value]
    return value


def dumpb(value: Any, option: int | None = None) -> bytes:
    """``value`` as JSON; strings that are not valid UTF-8 are shown with U+FFFD
    (:func:`valid_utf8`) rather than failing the document (the retry costs nothing
    when every string is valid)."""
    try:
        return orjson.dumps(value, option=option)
    except orjson.JSONEncodeError as exc:
        return _shown_valid(exc, value, option)


def _shown_valid(refused: orjson.JSONEncodeError, value: Any, option: int | None) -> bytes:
    """``value`` encoded again with its strings made valid UTF-8, when that is what
    orjson ``refused`` it for; else its error, raised."""
    if "surrogates" not in str(refused):
        raise refused
    return orjson.dumps(_valid(value), option=option)


def dumps_data(value: Any) -> str:
    """An entry's ``data`` as JSON: :func:`dumps`, but NaN and Infinity are refused
    (``ValueError``), where orjson would write ``null``: a model's score of NaN must not
    reach the next step as a silent null (it fails the output as not serializable)."""
    text = dumps(value)
    if "null" in text and _not_finite(value):
        raise ValueError("NaN and Infinity are not JSON (orjson would write them as null)")
    return text


def _not_finite(value: Any) -> bool:
    if isinstance(value, float):
        return value != value or value in (_INF, -_INF)
    if isinstance(value, dict):
        return any(_not_finite(v) for v in value.values())
    if isinstance(value, list | tuple):
        return any(_not_finite(v) for v in value)
    return False


_INF = float("inf")


def dumps(value: Any) -> str:
    try:  # not through dumpb: every output's data is encoded here, a call is a tenth of it
        return orjson.dumps(value).decode()
    except orjson.JSONEncodeError as exc:
        return _shown_valid(exc, value, None).decode()


#: orjson's own function, not a wrapper: every entry a worker takes is parsed here, and
#: a Python call in between costs a fifth of the parse of a small payload.
loads: Callable[[str | bytes], Any] = orjson.loads


def dumps_indented(value: Any) -> str:
    """For reading, not the wire: two-space indentation."""
    return dumpb(value, orjson.OPT_INDENT_2).decode()
