"""Who may use the console (CONTRACT §11, §14), and the CSRF token of its forms.

The console shares :class:`~printery.service.api.ApiAccess` with ``/v1``: with a token, a
request passes with the session cookie (set by logging in with the token) or with the
bearer header; without one, only a loopback listener answers (403 elsewhere).

The cookie never carries the token: it is an HMAC of a fixed label keyed by the token,
so it proves the token was given and changes when the token does (every session ends).
``HttpOnly`` (no script reads it), ``SameSite=Strict`` (no other site's page sends it),
``Secure`` when the request came over TLS. Every form carries a CSRF token, an HMAC of
the session keyed by a secret of this process, checked on every POST: a form rendered
by another process (or before a restart) is refused and simply loaded again.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from dataclasses import dataclass, field

from aiohttp import web

from printery.service.api import ApiAccess

__all__ = ["COOKIE", "ConsoleAuth"]

COOKIE = "printery_session"
_LABEL = b"printery console session v1"
#: The CSRF token's session when there is none: the login form, and a loopback console
#: without a token.
_ANONYMOUS = "anonymous"


@dataclass(frozen=True)
class ConsoleAuth:
    """Sessions and CSRF tokens for one process's console."""

    access: ApiAccess
    secret: bytes = field(default_factory=lambda: secrets.token_bytes(32))

    @property
    def needs_login(self) -> bool:
        return self.access.token is not None

    def session_value(self) -> str:
        assert self.access.token is not None
        return hmac.new(self.access.token.encode(), _LABEL, hashlib.sha256).hexdigest()

    def token_matches(self, given: str) -> bool:
        token = self.access.token
        return token is not None and hmac.compare_digest(given.encode(), token.encode())

    def signed_in(self, request: web.Request) -> bool:
        """Whether the request carries a valid session cookie or bearer header."""
        if self.access.token is None:
            return not self.access.public
        cookie = request.cookies.get(COOKIE, "")
        if cookie and hmac.compare_digest(cookie.encode(), self.session_value().encode()):
            return True
        return self.access.refusal(request) is None

    def forbidden(self) -> bool:
        """No token and a listener beyond loopback: the console answers 403, as ``/v1``."""
        return self.access.token is None and self.access.public

    def csrf(self, request: web.Request) -> str:
        """The CSRF token for forms shown to this request's session."""
        session = request.cookies.get(COOKIE, "") if self.needs_login else ""
        return hmac.new(self.secret, (session or _ANONYMOUS).encode(), hashlib.sha256).hexdigest()

    def csrf_valid(self, request: web.Request, given: str) -> bool:
        return bool(given) and hmac.compare_digest(given.encode(), self.csrf(request).encode())

    def login(self, response: web.StreamResponse, request: web.Request) -> None:
        response.set_cookie(COOKIE, self.session_value(), httponly=True, samesite="Strict",
                            secure=request.secure, path="/")

    @staticmethod
    def logout(response: web.StreamResponse) -> None:
        response.del_cookie(COOKIE, path="/")
