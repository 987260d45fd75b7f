"""One server per directory: an exclusive ``flock`` on ``<dir>/lock`` with
the holder's pid inside, so a second server names the one in its way."""
from __future__ import annotations

import fcntl
import os


class DirectoryBusy(Exception):
    """The directory cannot be locked; ``str()`` is one line saying why and what to do."""


def lock_directory(path: str, what: str, flag: str) -> int:
    """Lock ``path`` (``what`` names it in messages, ``flag`` picks another);
    the descriptor to keep open for as long as the lock must hold."""
    lock = os.path.join(path, "lock")
    try:
        fd = os.open(lock, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    except OSError as err:
        raise DirectoryBusy(f"{what} {path} is not writable: cannot open {lock}: "
                            f"{(err.strerror or str(err)).lower()} (pick another with {flag})") from None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "unknown"
        os.close(fd)
        raise DirectoryBusy(f"{what} {path} is in use by another queueserver (pid {holder}); "
                            f"stop it first or pick another {flag}") from None
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
    return fd
