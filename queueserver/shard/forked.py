"""A forked child that writes the shard's live state while the shard serves.

Why: serializing every job takes time in proportion to their number; done
in the shard's event loop, it pauses every client of the shard (seconds at
a million jobs). A forked child sees the state as of the fork, frozen (the
pages are shared copy-on-write), and writes it alone while the parent
serves: the fork is the only pause (as Redis writes its snapshots). The
log's compaction writes its snapshot segment so, and a primary the live
state a follower starts from.

The child keeps only the write end of a pipe (every other descriptor is
closed: a client connection the parent closes must not stay open in it),
is killed by the kernel if the parent dies (``PR_SET_PDEATHSIG``: no
orphan writer outlives a SIGKILLed shard), touches nothing else, and
leaves with ``os._exit`` (no handler, no buffer, no log of the parent's
runs in it). The parent reads the pipe without blocking its loop.
"""
from __future__ import annotations

import os
import signal
from typing import Callable, Iterator, Optional

import gevent
from gevent.socket import wait_read

from ..lifecycle import die_with

#: bytes taken from the pipe per read
READ_SIZE = 1 << 16


class Child:
    """A forked writer: its pid and the read end of its pipe."""

    __slots__ = ("pid", "fd", "status")

    def __init__(self, pid: int, fd: int) -> None:
        self.pid = pid
        self.fd = fd   # -1 once closed
        self.status: Optional[int] = None   # its wait status, once reaped

    def chunks(self) -> Iterator[bytes]:
        """What the child writes, as it comes, until it closes the pipe (or dies)."""
        while True:
            wait_read(self.fd)
            chunk = os.read(self.fd, READ_SIZE)
            if not chunk:
                return
            yield chunk

    def read_all(self) -> bytes:
        return b"".join(self.chunks())

    def reap(self) -> int:
        """Close the pipe and wait (yielding) for the child's exit; its wait status."""
        self._close()
        while self.status is None:
            pid, status = os.waitpid(self.pid, os.WNOHANG)
            if pid:
                self.status = status
            else:
                gevent.sleep(0.01)
        return self.status

    def kill(self) -> None:
        """Stop it whatever it is doing (it wrote nothing anyone trusts yet), and reap it."""
        if self.status is None:
            try:
                os.kill(self.pid, signal.SIGKILL)
            except ProcessLookupError:   # gone already (reaped below)
                pass
        self.reap()

    def _close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


def fork_child(write: Callable[[int], None]) -> Child:
    """Fork a child that runs ``write(fd)`` (``fd``: the pipe, blocking) and
    exits: status 0 if it returned, 1 if it raised."""
    parent = os.getpid()
    read, pipe = os.pipe()
    pid = os.fork()
    if pid == 0:
        status = 1
        try:
            die_with(parent)
            os.closerange(3, pipe)   # the read end included
            os.closerange(pipe + 1, os.sysconf("SC_OPEN_MAX"))
            write(pipe)
            status = 0
        finally:
            os._exit(status)
    os.close(pipe)
    return Child(pid, read)


def describe(status: int) -> str:
    """A wait status, as a log line says it."""
    code = os.waitstatus_to_exitcode(status)
    if code < 0:
        return f"was killed by signal {-code} ({signal.strsignal(-code) or 'unknown'})"
    return f"exited with status {code}"
