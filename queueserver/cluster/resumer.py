"""A node's watch for slot moves left without a driver, and their resumption.

Every node of a cluster on etcd runs one, in a thread of its supervisor. It
first writes the slot map's founding record if etcd has none
(:func:`.slotstore.ensure`), then reads ``<prefix>/moves/`` every
:data:`POLL` seconds. When moves are left and no ``driver`` key says a
process drives them (the command was killed, or the node it ran on), it
takes ``driver`` with a create-only transaction on a lease of its own: of
all the nodes, the one that wins starts ``queueserver cluster resume
--lease ID`` as its child, keeps the lease alive while the child runs and
revokes it once the child exits. A node that dies mid-resume lets its lease
lapse, and another node resumes in turn.

The work runs in that child (the links to the shards use gevent, which has
no place in the supervisor's threads); the supervisor reaps it and stops it
at its own shutdown.
"""
from __future__ import annotations

import logging
import os
import subprocess
import threading
import time
from typing import Optional

from ..lifecycle import SUPERVISOR_PID, python_command
from . import slotstore
from .clusterfile import ClusterSpec
from .coordination import REQUEST_TIMEOUT, CoordinationError, Etcd, HeldLease
from .intents import BadIntent, Driver, read

log = logging.getLogger("queueserver.cluster")

#: seconds between two looks at the moves in etcd
POLL = 1.0
#: seconds a node waits after a resume of its own failed before it may try again
RETRY_AFTER = 5.0
#: seconds a stopping supervisor gives its resume to stop
STOP_GRACE = 5.0


class Resumer:
    def __init__(self, cluster: ClusterSpec, node: str) -> None:
        assert cluster.etcd is not None
        self.cluster = cluster
        self.node = node
        self.etcd = Etcd(cluster.etcd)
        self._stop = threading.Event()
        self._lock = threading.Lock()   # the child and its lease: the thread's, and stop()'s at the end
        self._child: Optional[subprocess.Popen[bytes]] = None
        self._lease: Optional[HeldLease] = None
        self._quiet_until = 0.0
        self._trouble = ""   # the last etcd failure logged (each new one is logged once)
        self._thread = threading.Thread(target=self._run, name="moves-resumer", daemon=True)

    def start(self) -> "Resumer":
        self._thread.start()
        return self

    def _run(self) -> None:
        founded = False
        while not self._stop.is_set():
            try:
                if not founded:
                    slotstore.ensure(self.etcd, self.cluster.founders())
                    founded = True
                self._look()
                self._trouble = ""
            except (CoordinationError, BadIntent, ValueError) as err:
                if str(err) != self._trouble:
                    log.warning("slot moves: cannot watch them in etcd: %s; trying again", err)
                    self._trouble = str(err)
            self._stop.wait(POLL)

    def _look(self) -> None:
        with self._lock:
            child = self._child
            if child is not None:
                status = child.poll()
                if status is None:
                    if self._lease is not None and self._lease.lost.is_set():
                        log.warning("slot moves: node %s's lease as their driver lapsed; its resume "
                                    "stops (another node takes over)", self.node)
                        child.kill()
                    return
                self._ended(status)
        if time.monotonic() < self._quiet_until:
            return
        intents = read(self.etcd)
        if not intents.orphaned:
            return
        lease = HeldLease(self.etcd)
        if Driver.take(self.etcd, lease.id, "resume", self.node, self.cluster.founders()) is None:
            lease.revoke()   # another node won
            return
        with self._lock:
            if self._stop.is_set():
                lease.revoke()
                return
            log.warning("slot moves left without a driver: %s; node %s resumes them", intents.what(), self.node)
            self._lease = lease
            self._child = subprocess.Popen(
                [*python_command(), "-m", "queueserver", "cluster", "resume", "--cluster", self.cluster.path,
                 "--lease", f"{lease.id:x}"],
                process_group=0, env=dict(os.environ, **{SUPERVISOR_PID: str(os.getpid())}))
            log.info("slot moves: resume started (pid %d)", self._child.pid)

    def _ended(self, status: int, stopping: bool = False) -> None:
        """The child exited: its lease (and so the driver key) goes."""
        if status == 0:
            log.info("slot moves: resume done")
        elif stopping:
            log.warning("slot moves: resume stopped with node %s; another node takes it over", self.node)
        else:
            log.warning("slot moves: resume exited with status %d (see its lines above); a node tries "
                        "again in %.0f s", status, RETRY_AFTER)
            self._quiet_until = time.monotonic() + RETRY_AFTER
        self._child = None
        if self._lease is not None:
            self._lease.revoke()
            self._lease = None

    def stop(self) -> None:
        """Stop watching; a resume under way stops too (another node takes it over)."""
        self._stop.set()
        self._thread.join(REQUEST_TIMEOUT * 4)
        with self._lock:
            child = self._child
            if child is not None:
                if child.poll() is None:
                    child.terminate()
                try:
                    child.wait(STOP_GRACE)
                except subprocess.TimeoutExpired:
                    log.warning("slot moves: resume did not stop in time; killing it")
                    child.kill()
                    child.wait()
                self._ended(child.returncode, stopping=True)
        self.etcd.close()
