"""Stream data on the operator's terminal: shown, never obeyed.

Anyone who can write to a stream chooses the bytes ``dlq``, ``trace`` and ``review``
print. A terminal acts on control sequences in them (OSC sets the window title or a
hyperlink, or on some terminals writes the clipboard; CSI moves the cursor and can hide
text), so text headed for a terminal loses every control sequence and control character
here; JSON output keeps the data exactly, with the C1 controls that JSON allows raw
written as ``\\u`` escapes.
"""

from __future__ import annotations

import re

# A whole sequence where it can be recognised (so no payload of it is left over), then
# any control character still left. 7-bit (ESC ...) and 8-bit (C1) introducers alike.
_SEQUENCE = re.compile(
    r"(?:\x1b[\]P^_X]|[\x90\x98\x9d\x9e\x9f])[^\x07\x1b\x9c]*(?:\x07|\x1b\\|\x9c)?"  # OSC, DCS, PM, APC, SOS
    r"|(?:\x1b\[|\x9b)[0-?]*[ -/]*[@-~]?"  # CSI
    r"|\x1b[ -/]*[0-~]?"  # any other escape
)
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")
_LINE_BREAKS = re.compile(r"[\t\n]+")
_C1 = re.compile(r"[\x80-\x9f]")


def printable(text: str, *, one_line: bool = True) -> str:
    """``text`` without control sequences or control characters; with ``one_line``
    (a table cell) tabs and newlines become one space, else they are kept."""
    text = _CONTROL.sub("", _SEQUENCE.sub("", text))
    return _LINE_BREAKS.sub(" ", text) if one_line else text


def escape_c1(json_text: str) -> str:
    """JSON text with the C1 control characters escaped (JSON encoders escape only
    U+0000-U+001F; a terminal may act on U+0080-U+009F): the same document, inert."""
    return _C1.sub(lambda m: f"\\u{ord(m.group()):04x}", json_text)
