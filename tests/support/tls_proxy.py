"""A TLS-terminating TCP proxy in front of a plain server (the packaged Valkey binary is
built without TLS): clients speak ``rediss://`` to the proxy, which forwards plain bytes
to the server. Certificates come from a CA the test generates (``trustme``).

    async with TlsProxy("127.0.0.1", server.port, ca) as proxy:
        url = f"rediss://localhost:{proxy.port}/0?ssl_ca_certs={ca_path}"

``connections`` counts TLS handshakes that completed; ``refused`` those that failed.
"""

from __future__ import annotations

import asyncio
import contextlib
import ssl
from types import TracebackType

import trustme


class TlsProxy:
    def __init__(
        self, upstream_host: str, upstream_port: int, ca: trustme.CA, *,
        hostnames: tuple[str, ...] = ("localhost", "127.0.0.1"),
    ) -> None:
        self.upstream = (upstream_host, upstream_port)
        self.context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        self.context.minimum_version = ssl.TLSVersion.TLSv1_2
        ca.issue_cert(*hostnames).configure_cert(self.context)
        self.port = 0
        self.connections = 0
        self.refused = 0
        self._server: asyncio.Server | None = None
        self._tasks: set[asyncio.Task[None]] = set()

    async def start(self) -> None:
        self._server = await asyncio.start_server(
            self._serve, "127.0.0.1", 0, ssl=self.context, ssl_handshake_timeout=5,
        )
        self.port = self._server.sockets[0].getsockname()[1]

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        if self._server is not None:
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self._server.wait_closed(), 5)

    async def __aenter__(self) -> TlsProxy:
        await self.start()
        return self

    async def __aexit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.stop()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        self.connections += 1
        try:
            up_reader, up_writer = await asyncio.open_connection(*self.upstream)
        except OSError:
            writer.close()
            self._tasks.discard(task)
            return
        try:
            await asyncio.gather(_pipe(reader, up_writer), _pipe(up_reader, writer))
        finally:
            for w in (writer, up_writer):
                w.close()
            self._tasks.discard(task)


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while chunk := await reader.read(65536):
            writer.write(chunk)
            await writer.drain()
    except (ConnectionError, OSError, ssl.SSLError):
        pass
    finally:
        with contextlib.suppress(Exception):
            writer.close()
