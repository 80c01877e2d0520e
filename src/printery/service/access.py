"""Who may use the service's HTTP: one rule for ``/v1`` and the console
(docs/reference.md, The API: /v1; The web console), and the console's sessions and the
CSRF token of its forms.

The rule (:class:`Access`): with a token, a request passes with ``Authorization: Bearer
<token>`` (compared in constant time), or, in the console, with the session cookie set
by logging in with the token; without one, only a loopback listener answers (403
elsewhere). ``/v1`` renders a refusal as its JSON error, the console as its page; who
passes is decided here only.

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
import ipaddress
import secrets
from collections.abc import Mapping
from dataclasses import dataclass, field

from aiohttp import web

from printery.config import Settings

__all__ = ["COOKIE", "Access", "ConsoleAuth", "is_loopback", "service_access"]


@dataclass(frozen=True, slots=True)
class Access:
    """Who may call the service's HTTP: ``token`` (None: no token configured) and whether
    the listener is reachable from other hosts (``public``)."""

    token: str | None
    public: bool
    token_env: str = "PRINTERY_API_TOKEN"

    @property
    def forbidden(self) -> bool:
        """No token and a listener beyond loopback: every request is refused (403)."""
        return self.token is None and self.public

    def token_matches(self, given: str) -> bool:
        token = self.token
        return token is not None and hmac.compare_digest(given.encode(), token.encode())

    def bearer(self, request: web.Request) -> bool:
        """Whether the request carries ``Authorization: Bearer <token>`` of the token."""
        scheme, _, given = request.headers.get("Authorization", "").partition(" ")
        return scheme.lower() == "bearer" and self.token_matches(given.strip())


def is_loopback(host: str) -> bool:
    """Whether a listener on ``host`` is reachable from this machine only."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:  # a host name: it may resolve to anything
        return False


def service_access(settings: Settings, env: Mapping[str, str]) -> Access:
    """Who may call ``/v1`` and the console of a process serving ``--http-addr``."""
    bind = settings.http_bind
    return Access(token=env.get(settings.api_token_env) or None,
                  public=bind is not None and not is_loopback(bind[0]),
                  token_env=settings.api_token_env)


COOKIE = "printery_session"
_LABEL = b"printery console session v1"
#: The CSRF token's session when there is none: the login form, and a loopback console
#: without a token.
_ANONYMOUS = "anonymous"


@dataclass(frozen=True)
class ConsoleAuth:
    """Sessions and CSRF tokens for one process's console."""

    access: Access
    secret: bytes = field(default_factory=lambda: secrets.token_bytes(32))

    @property
    def needs_login(self) -> bool:
        return self.access.token is not None

    def session_value(self) -> str:
        assert self.access.token is not None
        return hmac.new(self.access.token.encode(), _LABEL, hashlib.sha256).hexdigest()

    def token_matches(self, given: str) -> bool:
        return self.access.token_matches(given)

    def signed_in(self, request: web.Request) -> bool:
        """Whether the request carries a valid session cookie or bearer header."""
        if self.access.token is None:
            return not self.access.forbidden
        cookie = request.cookies.get(COOKIE, "")
        if cookie and hmac.compare_digest(cookie.encode(), self.session_value().encode()):
            return True
        return self.access.bearer(request)

    def forbidden(self) -> bool:
        """No token and a listener beyond loopback: the console answers 403, as ``/v1``."""
        return self.access.forbidden

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
