"""What the server refuses for good: credentials, an ACL rule or a TLS certificate that
does not verify are configuration, not an outage, so no amount of waiting heals them
(docs/reference.md, Commands: exit 2 at start)."""

from __future__ import annotations

import ssl

from redis.exceptions import (
    AuthenticationError,
    AuthenticationWrongNumberOfArgsError,
    NoPermissionError,
)

from printery.base.errors import ConfigError, ServerRefused, describe

#: The client's exceptions for a refusal. ``AuthenticationError`` is a subclass of the
#: client's ``ConnectionError``, so it must be told apart before any retry.
REFUSALS = (AuthenticationError, AuthenticationWrongNumberOfArgsError, NoPermissionError)


def refused(exc: BaseException, shown_url: str | None, stream_prefix: str) -> ConfigError | None:
    """The configuration error ``exc`` stands for, or None when it is not a refusal.

    ``shown_url`` is the redacted URL: the error is printed, and must not leak the
    password that the server refused.
    """
    if isinstance(exc, NoPermissionError):
        return ConfigError(
            "redis_url", shown_url,
            f"the server's ACL refuses this user ({describe(exc)}): it needs the commands"
            f" of docs/security.md on the keys {stream_prefix}:*",
        )
    if isinstance(exc, REFUSALS):
        return ConfigError(
            "redis_url", shown_url,
            f"the server refused the credentials ({describe(exc)}): user and password"
            " that the server accepts",
        )
    certificate = _certificate_failure(exc)
    if certificate is not None:
        return ConfigError(
            "redis_url", shown_url,
            f"the server's TLS certificate does not verify ({certificate.verify_message}):"
            " ssl_ca_certs= in the URL must name the CA that signed it, and the host one"
            " the certificate names (docs/security.md)",
        )
    return None


def refusal_error(exc: BaseException) -> ServerRefused | None:
    """What a client, a follower or a command raises for a refusal (see :data:`REFUSALS`)
    instead of waiting it out as an outage: it says what to fix, not "unreachable"."""
    if isinstance(exc, NoPermissionError):
        return ServerRefused(f"the server's ACL refuses this user ({describe(exc)}): it needs "
                             "the commands of docs/security.md on the pipeline's keys")
    if isinstance(exc, REFUSALS):
        return ServerRefused(f"the server refused the credentials ({describe(exc)}): give a "
                             "user and password it accepts in the Redis URL")
    return None


def _certificate_failure(exc: BaseException) -> ssl.SSLCertVerificationError | None:
    """The certificate verification failure behind ``exc``: the client raises its own
    ``ConnectionError`` while handling the handshake's error, so it is in the chain."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        if isinstance(current, ssl.SSLCertVerificationError):
            return current
        seen.add(id(current))
        current = current.__cause__ or current.__context__
    return None
