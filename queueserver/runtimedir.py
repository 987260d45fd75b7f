"""The runtime directory: where one running server's processes meet.

It holds the shard sockets (and their readiness and control files), the
routers' readiness and control files, ``ports.json`` and ``lock``; the
supervisor makes it private and holds its lock for its whole life (see
:class:`RuntimeDir`). Without ``--runtime-dir`` it is a fresh temporary
directory, gone after the stop.
"""
from __future__ import annotations

import logging
import os
import shutil
import stat
import tempfile
from typing import Optional

from .dirlock import DirectoryBusy, lock_directory
from .jobnumbers import FILE_NAME as NUMBERS_FILE
from .listening import reason

log = logging.getLogger("queueserver.supervisor")


class RuntimeDirError(Exception):
    """The runtime directory cannot be this server's; ``str()`` is one line
    saying why and what to change, ``status`` the exit status it calls for."""

    def __init__(self, message: str, status: int = 2) -> None:
        super().__init__(message)
        self.status = status


class RuntimeDir:
    """The private directory of one running server, held by an exclusive lock.

    It holds the shard sockets, the routers' readiness files, ``ports.json``
    and ``lock`` (with the supervisor's pid). The lock is taken before
    anything in the directory is touched, so a second server pointed at the
    same directory leaves the running one alone. A directory that is a
    symlink or belongs to another user is refused rather than chmod-ed: its
    owner may rely on what is in it, and sockets there would not be private.
    """

    def __init__(self, path: Optional[str]) -> None:
        self.temporary = path is None
        self.path = path or ""
        self._lock_fd: Optional[int] = None

    def acquire(self) -> None:
        """Make (or check) the directory and lock it; :class:`RuntimeDirError` if it cannot be ours."""
        try:
            if self.temporary:
                self.path = tempfile.mkdtemp(prefix="queueserver-")  # created 0700
            else:
                self._make_private()
            self._lock()
            self._remove_run_files()  # an earlier run's readiness means nothing now
        except OSError as err:
            raise RuntimeDirError(f"cannot use runtime directory {self.path or tempfile.gettempdir()}: "
                               f"{reason(err)}", 1) from None

    def _make_private(self) -> None:
        path = self.path
        fix = "pick another with --runtime-dir"
        try:
            os.makedirs(path, 0o700)
        except FileExistsError:
            pass
        except OSError as err:
            raise RuntimeDirError(f"cannot create runtime directory {path}: {reason(err)} ({fix})") from None
        info = os.lstat(path)
        if stat.S_ISLNK(info.st_mode):
            raise RuntimeDirError(f"refusing runtime directory {path}: it is a symbolic link; give the real "
                               f"directory or {fix}")
        if not stat.S_ISDIR(info.st_mode):
            raise RuntimeDirError(f"runtime directory {path} is not a directory ({fix})")
        if info.st_uid != os.geteuid():
            raise RuntimeDirError(f"refusing runtime directory {path}: it is owned by uid {info.st_uid}, not "
                               f"by this server's user (uid {os.geteuid()}); chown it or {fix}")
        if stat.S_IMODE(info.st_mode) != 0o700:
            try:
                os.chmod(path, 0o700)
            except OSError as err:
                raise RuntimeDirError(f"cannot make runtime directory {path} private (0700): "
                                   f"{reason(err)} ({fix})") from None

    def _lock(self) -> None:
        try:
            self._lock_fd = lock_directory(self.path, "runtime directory", "--runtime-dir")
        except DirectoryBusy as err:
            raise RuntimeDirError(str(err)) from None

    def file(self, name: str) -> str:
        return os.path.join(self.path, name)

    @property
    def lock_fd(self) -> Optional[int]:
        return self._lock_fd

    def _remove_run_files(self) -> None:
        """Readiness files, ``ports.json``, shard and control sockets: what a run leaves."""
        for name in os.listdir(self.path):
            if name.startswith("ports.json") or name.endswith((".ready", ".refused", ".ctl")) or (
                    name.startswith("shard-") and name.endswith(".sock")) or name == NUMBERS_FILE:
                try:
                    os.unlink(self.file(name))
                except FileNotFoundError:
                    pass

    def release(self) -> None:
        """Clean up after a stop: a temporary directory goes; from a given one
        the run's files go, so nobody mistakes it for a live server."""
        if self._lock_fd is None:
            return
        if self.temporary:
            shutil.rmtree(self.path, ignore_errors=True)
        else:
            try:
                self._remove_run_files()
            except OSError as err:
                log.warning("could not clean runtime directory %s: %s", self.path, err)
        os.close(self._lock_fd)
        self._lock_fd = None
