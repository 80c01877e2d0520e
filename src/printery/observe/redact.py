"""Secret redaction: the one rule set for everything printery shows.

Logs, configuration errors, ``/status``, HTTP error details, ``--json`` documents and the
events an application writes (a webhook channel in ``notification:sent``) all go through
these rules, so a secret masked in one place is masked in every other. What becomes
``***``:

- **a URL's password**: ``scheme://user:***@host``. The password runs to the last ``@``
  of the authority, so one holding ``@`` is masked whole. The user name is kept, since
  Redis ACL user names say who connects and are not secret; :func:`redact_url` with
  ``keep_user=False`` masks the whole user info instead (``https://***@host``), for URLs
  that come from outside, where a user part alone is often a token;
- **secret query arguments**: the values of :data:`SECRET_QUERY_KEYS` (any case), as
  redis-py and many webhook receivers take credentials in the query;
- **values under secret-looking keys** (:func:`is_secret_key`: ``password``,
  ``redis_password``, ``api_key``, ``authorization``...), whole;
- **configured secret strings** (the Redis password, an application's secrets named by
  its ``AppConfig.secret_envs``), longest first, so a secret containing another is
  masked whole, and those registered at run time with :func:`register_secret` (a model
  step's API key), by every redactor of the process.

Best effort by design and never raising: the rules are text patterns, not a URL parser,
so a malformed URL (the typical bad value of a setting) is scrubbed as well.
"""

from __future__ import annotations

import re
from collections.abc import Collection, Mapping, MutableMapping
from typing import Any

__all__ = [
    "MASK",
    "SECRET_QUERY_KEYS",
    "Redactor",
    "is_secret_key",
    "redact_text",
    "redact_url",
    "register_secret",
]

MASK = "***"

#: Query arguments whose values are secrets by convention.
SECRET_QUERY_KEYS = frozenset({
    "password", "pass", "pwd", "secret", "token", "access_token", "api_key", "apikey",
    "key", "sig", "signature", "auth",
})

_SCHEME = r"[A-Za-z][A-Za-z0-9+.-]*://"
# Quotes end a URL too: the text may be a JSON document holding several.
_URL_PASSWORD = re.compile(rf"(?P<head>{_SCHEME}[^:/@\s\"']*):[^\s/\"']*@")
_URL_USER_INFO = re.compile(rf"(?P<head>{_SCHEME})[^/?#\s\"']*@")
_QUERY_SECRET = re.compile(
    r"(?i)(?P<head>[?&](?:" + "|".join(sorted(SECRET_QUERY_KEYS)) + r")=)[^&#\s\"']*"
)
# A key is secret when its last word is: `password`, `redis_password`, `notifier.secret`.
_SECRET_KEY = re.compile(
    r"(?i)(?:^|[_.\-])(?:password|passwd|pwd|secret|token|credentials?|authorization"
    r"|api_?key|access_?key)$"
)


#: Secrets learnt at run time (:func:`register_secret`), longest first.
_registered: list[str] = []


def register_secret(value: str) -> None:
    """Mask ``value`` wherever any :class:`Redactor` of this process looks (logs above
    all), for secrets read after logging was configured, such as an API key a step reads
    from its environment variable."""
    if value and value not in _registered:
        _registered.append(value)
        _registered.sort(key=len, reverse=True)


def is_secret_key(key: str) -> bool:
    """Whether values under ``key`` (a log field, a setting, a dotted path) are secrets."""
    return bool(_SECRET_KEY.search(key))


def redact_text(text: str) -> str:
    """``text`` with every URL password and secret query argument masked."""
    if "://" in text and "@" in text:
        text = _URL_PASSWORD.sub(rf"\g<head>:{MASK}@", text)
    if "=" in text:
        text = _QUERY_SECRET.sub(rf"\g<head>{MASK}", text)
    return text


def redact_url(url: str, *, keep_user: bool = True) -> str:
    """``url`` as it may be shown: ``redis://:pw@host:6379`` -> ``redis://:***@host:6379``.

    ``keep_user=False`` masks the whole user info (``https://***@host``): for URLs that
    producers wrote (webhooks, health URLs), where a user part alone may be a token.
    """
    if not keep_user and "@" in url:
        url = _URL_USER_INFO.sub(rf"\g<head>{MASK}@", url)
    return redact_text(url)


class Redactor:
    """Masks configured secrets and the rules above in strings and nested values.

    Also a structlog processor (``redactor(logger, method, event_dict)``). Values that
    are neither strings, numbers nor containers (exceptions, paths) are turned into
    their ``str`` first, since a renderer would otherwise print them unseen.
    """

    def __init__(self, secrets: Collection[str] = ()) -> None:
        self._secrets = sorted({s for s in secrets if s}, key=len, reverse=True)

    def text(self, text: str) -> str:
        for secret in self._secrets:
            if secret in text:
                text = text.replace(secret, MASK)
        for secret in _registered:
            if secret in text:
                text = text.replace(secret, MASK)
        return redact_text(text)

    def scrub(self, value: object) -> object:
        """``value`` with every string in it redacted; mapping keys decide by name."""
        if isinstance(value, str):
            return self.text(value)
        if value is None or isinstance(value, bool | int | float):
            return value
        if isinstance(value, Mapping):
            return {key: self.field(str(key), item) for key, item in value.items()}
        if isinstance(value, list | tuple | set | frozenset):
            return [self.scrub(item) for item in value]
        return self.text(str(value))

    def field(self, key: str, value: object) -> object:
        """The value of field ``key``: masked whole under a secret-looking key."""
        if is_secret_key(key) and value not in (None, ""):
            return MASK
        return self.scrub(value)

    def __call__(
        self, logger: object, method_name: str, event_dict: MutableMapping[str, Any]
    ) -> MutableMapping[str, Any]:
        for key, value in event_dict.items():
            if not key.startswith("_"):  # structlog's own bookkeeping (`_record`)
                event_dict[key] = self.field(key, value)
        return event_dict
