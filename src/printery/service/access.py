"""Who may use the service's HTTP: one rule for ``/v1`` and the console
(docs/reference.md, The API: /v1; The web console), and the console's sessions and the
CSRF token of its forms.

The rule (:class:`Access`): with a token, a request passes with ``Authorization: Bearer
<token>`` (compared in constant time), or, in the console, with the session cookie set
by logging in with the token; without one, only a loopback listener answers (403
elsewhere). ``/v1`` renders a refusal as its JSON error, the console as its page; who
passes is decided here only.

A login opens a session (:class:`ConsoleAuth`): a random id kept in the server for
``[console] session_ttl`` seconds (:mod:`printery.store.sessions`), named by a cookie
signed and timestamped with the token (itsdangerous, as Flask and Starlette sign theirs,
rather than an HMAC of our own). The cookie passes while its signature holds (a new token
ends every session), while it is younger than the TTL and while its session is open:
logging out closes the session for every process, so a copy of the cookie taken before
is refused after. It never carries the token. ``HttpOnly`` (no script reads it),
``SameSite=Strict`` (no other site's page sends it), ``Secure`` when the request came
over TLS. Every form carries a CSRF token, an HMAC of the session keyed by a secret of
this process, checked on every POST: a form rendered by another process (or before a
restart) is refused and simply loaded again.
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
import math
import secrets
from collections.abc import Mapping
from dataclasses import dataclass

from aiohttp import web
from itsdangerous import BadSignature, URLSafeTimedSerializer

from printery.settings.config import Settings
from printery.store import Redis
from printery.store.sessions import end_session, open_session, session_open
from printery.wire.keys import StreamKeys

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
#: Signs a session cookie (with the token as the key), so that no other signed value of
#: printery's can pass for one.
_SALT = "printery console session"
#: The CSRF token's session when there is none: the login form, and a loopback console
#: without a token.
_ANONYMOUS = "anonymous"


class ConsoleAuth:
    """Sessions and CSRF tokens for one process's console: sessions live in the server
    (``client``, under ``keys``) for ``session_ttl`` seconds from their login."""

    def __init__(self, access: Access, client: Redis, keys: StreamKeys, *,
                 session_ttl: float, secret: bytes | None = None) -> None:
        self.access = access
        self.client = client
        self.keys = keys
        self.session_ttl = session_ttl
        self.secret = secret if secret is not None else secrets.token_bytes(32)
        self._signer = (None if access.token is None
                        else URLSafeTimedSerializer(access.token, salt=_SALT))

    @property
    def needs_login(self) -> bool:
        return self.access.token is not None

    def token_matches(self, given: str) -> bool:
        return self.access.token_matches(given)

    def _session(self, cookie: str, *, fresh: bool) -> str | None:
        """The session id ``cookie`` names when its signature holds (with ``fresh``, also
        when it is younger than the TTL), else None."""
        if self._signer is None or not cookie:
            return None
        try:
            session = self._signer.loads(
                cookie, max_age=math.ceil(self.session_ttl) if fresh else None)
        except BadSignature:  # SignatureExpired is one too
            return None
        return session if isinstance(session, str) else None

    async def signed_in(self, request: web.Request) -> bool:
        """Whether the request carries the bearer header, or the cookie of an open
        session. Asks the server (the session may have been closed by another process):
        raises what the client raises when it does not answer."""
        if self.access.token is None:
            return not self.access.forbidden
        if self.access.bearer(request):
            return True
        session = self._session(request.cookies.get(COOKIE, ""), fresh=True)
        return session is not None and await session_open(self.client, self.keys, session)

    def forbidden(self) -> bool:
        """No token and a listener beyond loopback: the console answers 403, as ``/v1``."""
        return self.access.forbidden

    def csrf(self, request: web.Request) -> str:
        """The CSRF token for forms shown to this request's session."""
        session = request.cookies.get(COOKIE, "") if self.needs_login else ""
        return hmac.new(self.secret, (session or _ANONYMOUS).encode(), hashlib.sha256).hexdigest()

    def csrf_valid(self, request: web.Request, given: str) -> bool:
        return bool(given) and hmac.compare_digest(given.encode(), self.csrf(request).encode())

    async def login(self, response: web.StreamResponse, request: web.Request) -> None:
        """Open a session and give ``response`` its cookie."""
        assert self._signer is not None
        session = secrets.token_urlsafe(24)
        await open_session(self.client, self.keys, session, self.session_ttl)
        response.set_cookie(COOKIE, self._signer.dumps(session),
                            max_age=math.ceil(self.session_ttl), httponly=True,
                            samesite="Strict", secure=request.secure, path="/")

    async def logout(self, response: web.StreamResponse, request: web.Request) -> None:
        """Close the request's session for every process (an expired one too) and drop
        its cookie."""
        session = self._session(request.cookies.get(COOKIE, ""), fresh=False)
        if session is not None:
            await end_session(self.client, self.keys, session)
        response.del_cookie(COOKIE, path="/")
