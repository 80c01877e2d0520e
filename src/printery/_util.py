"""Small helpers shared by every layer: clocks, ids, time formats."""

from __future__ import annotations

import os
import secrets
import socket
import time
from datetime import UTC, datetime


def now_rfc3339() -> str:
    """The current UTC time as RFC 3339 with milliseconds, the format of `produced_at`."""
    return datetime.now(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def parse_rfc3339(text: str) -> datetime:
    """Parse an RFC 3339 timestamp (``Z`` or offset); naive input is taken as UTC."""
    parsed = datetime.fromisoformat(text.replace("Z", "+00:00"))
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=UTC)


def new_id(prefix: str) -> str:
    """A unique, sortable-enough id: ``<prefix>-<ms time hex>-<random hex>``."""
    return f"{prefix}-{int(time.time() * 1000):x}-{secrets.token_hex(5)}"


def hostname() -> str:
    return socket.gethostname()


def consumer_name(worker: str, index: int) -> str:
    """Unique per host, process, worker and consumer index, as the contract asks."""
    return f"{hostname()}:{os.getpid()}:{worker}:{index}"


def stream_id_ms(entry_id: str) -> int:
    """Milliseconds part of a stream entry id (``1700000000000-3`` -> 1700000000000)."""
    return int(entry_id.split("-", 1)[0])
