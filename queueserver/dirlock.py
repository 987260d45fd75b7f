"""One server per directory: an exclusive ``flock`` on ``<dir>/lock`` with
the holder's pid inside, so a second server names the one in its way.

The supervisor's children inherit the lock, so a directory stays locked
while any process of its server lives. When the recorded holder is dead
but the lock is still held, its last processes are on their way out (they
die with their supervisor): the lock is waited for, briefly, so a restart
right after a crash starts rather than failing.
"""
from __future__ import annotations

import fcntl
import logging
import os
import time

log = logging.getLogger("queueserver.supervisor")

REMNANT_WAIT = 5.0   # seconds to wait for a dead holder's processes to let go


class DirectoryBusy(Exception):
    """The directory cannot be locked; ``str()`` is one line saying why and what to do."""


def lock_directory(path: str, what: str, flag: str, remnant_wait: float = REMNANT_WAIT) -> int:
    """Lock ``path`` (``what`` names it in messages, ``flag`` picks another);
    the descriptor to keep open for as long as the lock must hold."""
    lock = os.path.join(path, "lock")
    try:
        fd = os.open(lock, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    except OSError as err:
        raise DirectoryBusy(f"{what} {path} is not writable: cannot open {lock}: "
                            f"{(err.strerror or str(err)).lower()} (pick another with {flag})") from None
    deadline = time.monotonic() + remnant_wait
    waiting = False
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            break
        except BlockingIOError:
            holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "unknown"
            if not holder.isdigit() or _alive(int(holder)) or time.monotonic() > deadline:
                os.close(fd)
                raise DirectoryBusy(f"{what} {path} is in use by another queueserver (pid {holder}"
                                    f"{'' if not waiting else ', or processes it left'}); "
                                    f"stop it first or pick another {flag}") from None
            if not waiting:
                log.info("%s %s: server pid %s is gone; waiting for its last processes to exit",
                         what, path, holder)
                waiting = True
            time.sleep(0.02)
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
    return fd


def _alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie, dead but not yet reaped, does not)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return True
