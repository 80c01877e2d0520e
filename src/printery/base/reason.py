"""Reasons: why an input did not pass a gate, machine-actionable (a stable code, the
field path, a message for humans)."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict


class Reason(BaseModel):
    """Why something did not pass: a stable ``code``, the ``field`` path, a human ``message``.

    ``field`` is a path like ``dependencies[1].health_url`` (empty when it is about the
    whole input). Codes are part of a pipeline's contract: callers branch on them.
    ``Reason("code", "field", "message")`` and the keyword form are the same: the docs
    write it positionally, so the signature takes it that way too.
    """

    model_config = ConfigDict(frozen=True)

    code: str
    field: str = ""
    message: str = ""

    def __init__(self, code: str, field: str = "", message: str = "") -> None:
        super().__init__(code=code, field=field, message=message)

    def as_dict(self) -> dict[str, Any]:
        return {"code": self.code, "field": self.field, "message": self.message}
