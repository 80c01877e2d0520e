"""Large payloads by reference (docs/reference.md, Streams and entries): big ``data`` goes
to a content-addressed blob once and the entry carries ``{"$ref": "blob:<sha256>", "size":
N}``. Consumers resolve before decoding, so handlers never know."""

from __future__ import annotations

import hashlib
from typing import Any

from printery.base import _json
from printery.base.errors import BlobMissing, PayloadTooLarge
from printery.store.blobs import read_blob, write_blob
from printery.transport.connection import Redis
from printery.wire.keys import StreamKeys

REF_PREFIX = "blob:"


class PayloadStore:
    """Moves large payloads out of stream entries and back in."""

    def __init__(
        self,
        client: Redis,
        keys: StreamKeys,
        *,
        limit: int = 1_048_576,
        inline_limit: int = 65_536,
        ttl: float = 604_800,
    ) -> None:
        self.client = client
        self.keys = keys
        self.limit = limit
        self.inline_limit = inline_limit
        self.ttl_ms = int(ttl * 1000)

    def within(self, keys: StreamKeys) -> PayloadStore:
        """This store with blobs under ``keys`` (a partition's: a run's blobs live in its
        partition, so a commit and the blob it references share a slot)."""
        if keys == self.keys:
            return self
        return PayloadStore(self.client, keys, limit=self.limit,
                            inline_limit=self.inline_limit, ttl=self.ttl_ms / 1000)

    @staticmethod
    def reference_of(data_json: str) -> tuple[str, int] | None:
        """``(digest, size)`` if ``data_json`` is a ``$ref`` payload, else None (cheap)."""
        if not data_json.startswith('{"$ref"'):
            return None
        try:
            value = _json.loads(data_json)
        except ValueError:
            return None
        ref = value.get("$ref") if isinstance(value, dict) else None
        if not isinstance(ref, str) or not ref.startswith(REF_PREFIX):
            return None
        size = value.get("size")
        return ref[len(REF_PREFIX) :], size if isinstance(size, int) else -1

    async def resolve_fields(self, fields: dict[str, str]) -> dict[str, str]:
        """Fields with a ``$ref`` data replaced by the blob's content.

        Raises :class:`BlobMissing` for a reference to nothing, :class:`PayloadTooLarge`
        when the resolved data exceeds the payload limit.
        """
        data = fields.get("data")
        if data is None:
            return fields
        ref = self.reference_of(data)
        if ref is None:
            return fields
        digest, _size = ref
        text = await self._blob(digest)
        if len(text) > self.limit:
            raise PayloadTooLarge(f"resolved data is {len(text)} bytes, limit {self.limit}")
        return {**fields, "data": text}

    async def resolved(self, data: Any) -> Any:
        """``data`` (decoded) with a ``$ref`` replaced by its blob's data, for a reader of
        entries (a run's result, a review, a replay's copy). Raises :class:`BlobMissing`
        for a reference to nothing."""
        ref = data.get("$ref") if isinstance(data, dict) and len(data) <= 2 else None
        if not isinstance(ref, str) or not ref.startswith(REF_PREFIX):
            return data
        return _json.loads(await self._blob(ref[len(REF_PREFIX):]))

    async def _blob(self, digest: str) -> str:
        text = await read_blob(self.client, self.keys, digest)
        if text is None:
            raise BlobMissing(f"blob {digest} does not exist (expired or never written)")
        return text

    async def store(self, data_json: str) -> str:
        digest = hashlib.sha256(data_json.encode()).hexdigest()
        await write_blob(self.client, self.keys, digest, data_json, ttl_ms=self.ttl_ms)
        return _json.dumps({"$ref": f"{REF_PREFIX}{digest}", "size": len(data_json)})
