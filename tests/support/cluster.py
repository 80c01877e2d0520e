"""A real Valkey Cluster for the tests: six processes of the packaged binary (3 masters,
3 replicas) on loopback ports, formed by hand the way an operator would (CLUSTER MEET,
ADDSLOTSRANGE over the masters, CLUSTER REPLICATE), so the tests exercise the same
MOVED/failover paths a production cluster has.

Every wait is bounded and raises :class:`ClusterError` with what the cluster said last.
The node timeout is short (one second) so that a killed master is failed over by its
replica in a few seconds; ``cluster-replica-validity-factor 0`` lets a replica take
over however long ago it last heard from its master.

What "no loss" needs on this cluster: replication is asynchronous, so a write the master
acknowledged may not have reached the replica when the master dies. A write followed by
``WAIT 1 <ms>`` that answers 1 is on the replica, and with one replica per master that
replica is the one promoted, so such a write survives a kill -9 of its master.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import redis

from printery.base.errors import ServerStartError
from printery.servers.process import ServerProcess, free_port

SLOTS = 16384
#: Seconds a cluster may take to form (every node known to every other, slots served,
#: replicas in sync). Six servers handshaking on a machine busy with other tests took
#: more than 30 s once; the waits end as soon as the cluster is formed.
FORM_TIMEOUT = 90.0
#: Seconds between two introductions of a node that does not know every other yet.
MEET_AGAIN = 1.0


class ClusterError(RuntimeError):
    """The cluster did not reach the state a test waits for in time."""


def _wait(what: str, check: Callable[[], Any], timeout: float, interval: float = 0.05) -> Any:
    """Poll ``check`` until it returns something truthy; ``ClusterError`` after ``timeout``
    naming ``what`` and the last answer (or error)."""
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        try:
            last = check()
        except (redis.RedisError, OSError) as exc:
            last = exc
        else:
            if last:
                return last
        time.sleep(interval)
    raise ClusterError(f"{what}: not within {timeout}s (last: {last!r})")


class Node:
    """One cluster node: its server process and a plain (non-cluster) client to it."""

    def __init__(self, data_dir: Path, port: int, node_timeout_ms: int) -> None:
        self.bus_port = free_port()
        self.server = ServerProcess(
            data_dir, port=port,
            extra_args=[
                "--cluster-enabled", "yes",
                "--cluster-config-file", str(data_dir / "nodes.conf"),
                # Its own bus port: a free port may be above 55535, where port + 10000
                # (the default bus port) does not exist.
                "--cluster-port", str(self.bus_port),
                "--cluster-node-timeout", str(node_timeout_ms),
                "--cluster-replica-validity-factor", "0",
                "--cluster-require-full-coverage", "yes",
                # A replica's first sync (at forming, after a rejoin) starts at once:
                # the server's default waits 5 s for more replicas to share it, which
                # was most of the time a test's own cluster took to form.
                "--repl-diskless-sync-delay", "0",
            ],
        )
        self.id = ""

    @property
    def port(self) -> int:
        return self.server.port

    @property
    def address(self) -> str:
        return f"{self.server.host}:{self.server.port}"

    @property
    def alive(self) -> bool:
        return self.server.process is not None and self.server.process.poll() is None

    def client(self) -> redis.Redis:
        return redis.Redis(host=self.server.host, port=self.port, decode_responses=True,
                           socket_timeout=2, socket_connect_timeout=2)

    def call(self, *args: Any) -> Any:
        with self.client() as conn:
            return conn.execute_command(*args)

    def info(self, section: str) -> dict[str, Any]:
        with self.client() as conn:
            info: dict[str, Any] = conn.info(section)
            return info


class ValkeyCluster:
    """``masters`` masters with ``replicas`` replicas each, formed and in sync after
    :meth:`start`; :meth:`kill_master` is a kill -9 followed by the wait for the
    promotion; :meth:`stop` stops every process (also after a failed start)."""

    def __init__(self, base_dir: Path, *, masters: int = 3, replicas: int = 1,
                 node_timeout_ms: int = 1000) -> None:
        self.base_dir = Path(base_dir)
        self.masters_count = masters
        self.node_timeout_ms = node_timeout_ms
        total = masters * (1 + replicas)
        self.nodes = [Node(self.base_dir / f"node-{i}", free_port(), node_timeout_ms)
                      for i in range(total)]

    # -- addresses ------------------------------------------------------------------------

    @property
    def url(self) -> str:
        """``redis+cluster://`` with every node as a startup node."""
        return "redis+cluster://" + ",".join(node.address for node in self.nodes)

    def masters(self) -> list[Node]:
        """The live nodes that are masters now (after a failover, the promoted replica)."""
        return [node for node in self.nodes if node.alive and node.info("replication")["role"] == "master"]

    def master_of(self, key: str) -> Node:
        """The live master that holds ``key``'s slot now."""
        slot = int(self._any_live().call("CLUSTER", "KEYSLOT", key))
        for start, end, primary, *_replicas in self._any_live().call("CLUSTER", "SLOTS"):
            if int(start) <= slot <= int(end):
                return next(node for node in self.nodes if node.port == int(primary[1]))
        raise ClusterError(f"no master holds slot {slot}")

    def replica_of(self, master: Node) -> Node:
        for node in self.nodes:
            if node is not master and node.alive:
                info = node.info("replication")
                if info["role"] == "slave" and int(info["master_port"]) == master.port:
                    return node
        raise ClusterError(f"{master.address} has no live replica")

    # -- lifecycle ------------------------------------------------------------------------

    def start(self, timeout: float = FORM_TIMEOUT) -> None:
        try:
            for i in range(len(self.nodes)):
                node = self._started(i)
                node.id = str(node.call("CLUSTER", "MYID"))
            self._form(timeout)
        except BaseException:
            self.stop()
            raise

    def _started(self, i: int) -> Node:
        """Node ``i`` started. Its two ports were free when chosen, not reserved: a
        server of another test may take one first (``Failed listening on port``); the
        node then gets two other ports."""
        for attempt in range(3):
            node = self.nodes[i]
            try:
                node.server.start()
                return node
            except ServerStartError as exc:
                if "Failed listening" not in str(exc) or attempt == 2:
                    raise
                node.server.stop()
                data_dir = self.base_dir / f"node-{i}"
                (data_dir / "nodes.conf").unlink(missing_ok=True)
                self.nodes[i] = Node(data_dir, free_port(), self.node_timeout_ms)
        raise AssertionError("unreachable")

    def _form(self, timeout: float) -> None:
        self._meet()
        masters = self.nodes[: self.masters_count]
        per = SLOTS // len(masters)
        for i, node in enumerate(masters):
            end = SLOTS - 1 if i == len(masters) - 1 else (i + 1) * per - 1
            node.call("CLUSTER", "ADDSLOTSRANGE", i * per, end)
        again = [time.monotonic() + MEET_AGAIN]
        _wait("every node knows every other", lambda: self._introduced(again), timeout)
        for i, node in enumerate(self.nodes[self.masters_count:]):
            master = masters[i % len(masters)]
            # Refused ("Unknown node") until the replica has the master's id from gossip.
            _wait(f"{node.address} replicating {master.address}",
                  lambda node=node, master=master: node.call("CLUSTER", "REPLICATE", master.id),
                  timeout)
        self.wait_healthy(timeout)

    def _meet(self) -> None:
        """Introduce every node to the first; gossip does the rest."""
        first = self.nodes[0]
        for node in self.nodes[1:]:
            node.call("CLUSTER", "MEET", first.server.host, first.port, first.bus_port)

    def _introduced(self, again: list[float]) -> bool:
        """Whether every node knows every other. One that does not yet is introduced again
        to the ones it lacks, at most every :data:`MEET_AGAIN` seconds (``again[0]``: when
        next): a handshake not answered within the node timeout is dropped for good, which
        a loaded machine does to a one-second timeout, and the cluster never formed."""
        missing = {node.address: self._unknown_to(node) for node in self.nodes}
        if not any(missing.values()):
            return True
        if time.monotonic() >= again[0]:
            again[0] = time.monotonic() + MEET_AGAIN
            for node in self.nodes:
                for other in missing[node.address]:
                    node.call("CLUSTER", "MEET", other.server.host, other.port, other.bus_port)
        return False

    def _unknown_to(self, node: Node) -> list[Node]:
        """The nodes ``node`` does not know yet (a handshake under way is not knowing)."""
        known = set()
        for line in str(node.call("CLUSTER", "NODES")).splitlines():
            fields = line.split()
            if len(fields) > 2 and "handshake" not in fields[2] and "noaddr" not in fields[2]:
                known.add(fields[1].split("@")[0])
        return [other for other in self.nodes
                if other is not node and other.address not in known]

    def wait_healthy(self, timeout: float = 30.0) -> None:
        """Every live node says ``cluster_state:ok``, every live replica is in sync, and
        there are as many masters as the cluster was formed with."""
        try:
            _wait("cluster_state:ok with every replica in sync",
                  lambda: not self.problems(), timeout)
        except ClusterError as exc:
            raise ClusterError(f"{exc}; {self.problems()}") from None

    def problems(self) -> list[str]:
        """What keeps the cluster from being healthy now (empty when it is)."""
        found: list[str] = []
        for node in self.nodes:
            if not node.alive:
                continue
            if "cluster_state:ok" not in str(node.call("CLUSTER", "INFO")):
                found.append(f"{node.address}: cluster_state not ok")
            repl = node.info("replication")
            if repl["role"] == "slave" and (repl.get("master_link_status") != "up"
                                            or int(repl.get("master_sync_in_progress", 1))):
                found.append(f"{node.address}: replica not in sync")
        masters = len(self.masters())
        if masters != self.masters_count:
            found.append(f"{masters} masters, not {self.masters_count}")
        return found

    def kill_master(self, master: Node, timeout: float = 30.0) -> Node:
        """kill -9 ``master``; wait until its replica says it is a master and the cluster is
        ok again; the promoted node."""
        replica = self.replica_of(master)
        master.server.kill()
        _wait(f"{replica.address} promoted after {master.address} was killed",
              lambda: replica.info("replication")["role"] == "master", timeout)
        _wait("cluster_state:ok after the failover",
              lambda: all("cluster_state:ok" in str(node.call("CLUSTER", "INFO"))
                          for node in self.nodes if node.alive), timeout)
        return replica

    def rejoin(self, node: Node, timeout: float = 30.0) -> None:
        """Start a killed ``node`` again (same port, same ``nodes.conf``): it learns that its
        replica was promoted and rejoins as that node's replica; wait until the cluster is
        healthy again (every replica in sync)."""
        node.server.start()
        _wait(f"{node.address} back as a replica",
              lambda: node.info("replication")["role"] == "slave", timeout)
        self.wait_healthy(timeout)

    def partition_masters(self, keys: list[str]) -> dict[int, list[str]]:
        """Which of ``keys`` each live master (by port) holds now."""
        held: dict[int, list[str]] = {}
        for key in keys:
            held.setdefault(self.master_of(key).port, []).append(key)
        return held

    def stop(self) -> None:
        for node in self.nodes:
            with contextlib.suppress(Exception):
                node.server.kill()

    def _any_live(self) -> Node:
        for node in self.nodes:
            if node.alive:
                return node
        raise ClusterError("no live node")

    def __enter__(self) -> ValkeyCluster:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

