"""The whole service over a secure connection (issue 6 item 7): ``printery-workers`` on
``rediss://`` (a TLS proxy with a CA the test generates, in front of the server) as an
ACL user confined to its prefix and to the commands of docs/security.md. Deployments
run end to end, the server refuses nothing, and the password shows up nowhere."""

from __future__ import annotations

import asyncio
from pathlib import Path

import redis.asyncio as aioredis
import trustme

from printery.servers.process import ServerProcess
from printery.testing import unique_prefix, wait_for
from support.acl import acl_denials, acl_rule
from support.service import spawn, started_entry
from support.tls_proxy import TlsProxy

DEPLOYMENTS = 10
PASSWORD = "acl-Pa55-word-xyz"


async def test_service_over_tls_as_minimal_acl_user(
    server: ServerProcess, client: aioredis.Redis, tmp_path: Path
) -> None:
    prefix = unique_prefix("sec")
    user = f"svc-{prefix.rsplit(':', 1)[-1]}"
    await client.execute_command("ACL", "SETUSER", user, *acl_rule(prefix, PASSWORD))
    await client.execute_command("ACL", "LOG", "RESET")
    authority = trustme.CA()
    ca_path = tmp_path / "ca.pem"
    authority.cert_pem.write_to_path(str(ca_path))
    try:
        async with TlsProxy("127.0.0.1", server.port, authority) as proxy:
            url = f"rediss://{user}:{PASSWORD}@localhost:{proxy.port}/0?ssl_ca_certs={ca_path}"
            # The service is driven from a thread: this loop keeps serving the proxy.
            svc = await asyncio.to_thread(
                spawn, ["--redis-url", url, "--stream-prefix", prefix], cwd=tmp_path)
            try:
                await asyncio.to_thread(
                    svc.wait_until, lambda: svc.get("/readyz").status_code == 200,
                    what="/readyz 200 over TLS")
                for i in range(DEPLOYMENTS):
                    await client.xadd(f"{prefix}:deployment:started", started_entry(f"dep-sec-{i}"))

                async def all_sent() -> bool:
                    return int(await client.xlen(f"{prefix}:notification:sent")) == DEPLOYMENTS

                try:
                    await wait_for(all_sent, timeout=30)
                except TimeoutError:
                    log = await client.execute_command("ACL", "LOG")
                    raise AssertionError(f"{acl_denials(log, user)}\n{svc.log()}") from None
                status = await asyncio.to_thread(svc.get, "/status")
                metrics = await asyncio.to_thread(svc.get, "/metrics")
            finally:
                code = await asyncio.to_thread(svc.stop)
            assert code == 0, svc.log()
            assert proxy.connections >= 2, "every connection went through TLS"
        denied = acl_denials(await client.execute_command("ACL", "LOG"), user)
        assert denied == [], f"commands or keys the rule misses: {denied}"
        for text in (svc.log(), status.text, metrics.text):
            assert PASSWORD not in text
        assert status.json()["redis"]["connected"] is True
    finally:
        await client.execute_command("ACL", "DELUSER", user)


async def test_a_certificate_that_does_not_verify_at_start_exits_2(
    server: ServerProcess, tmp_path: Path
) -> None:
    """A server certificate signed by another CA than the one the URL names is
    configuration, like refused credentials: exit 2 with one line naming ``redis_url``,
    not a wait for a server that is up."""
    other = tmp_path / "other-ca.pem"
    trustme.CA().cert_pem.write_to_path(str(other))
    async with TlsProxy("127.0.0.1", server.port, trustme.CA()) as proxy:
        url = f"rediss://localhost:{proxy.port}/0?ssl_ca_certs={other}"
        svc = await asyncio.to_thread(
            spawn, ["--redis-url", url, "--stream-prefix", unique_prefix("tls-bad")],
            cwd=tmp_path, wait=False)
        code = await asyncio.to_thread(svc.wait, 30)
    assert code == 2, svc.log()
    named = [line for line in svc.log().splitlines() if "invalid redis_url" in line]
    assert len(named) == 1 and "certificate" in named[0], svc.log()
    assert "retrying" not in svc.log()
