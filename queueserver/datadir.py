"""The data directory: one log directory per shard, and the layout that
says which shard owns which queues.

Queue names map to shards by ``shard_for(name, shards)``, so the jobs in a
data directory are only where a server looks for them when it runs the
same number of shards that wrote them. ``layout.json`` records that number
(and the hash rule) the first time a durable server starts; later starts
keep it: with no shard count given, the recorded one is used, and a
different one given explicitly is refused with one line rather than
leaving jobs on shards nobody asks.

Before any shard starts, :meth:`DataDir.acquire` also checks that this
server's user can read and write every shard's files (its log directory and
segments, its history directory): a directory left behind by another user
(say, made by ``make run`` as root, then served as a service user) is one
line naming the file, its owner and the fix, not a shard that fails at start
again and again.
"""
from __future__ import annotations

import json
import logging
import os
import pwd
import stat
from typing import Optional, TypedDict, cast

from .dirlock import DirectoryBusy, lock_directory
from .reshard import finish_interrupted, reshard
from .store import StoreError
from .jobnumbers import FILE_NAME as NUMBERS_FILE, NumberFile, NumbersError
from .store import shard_dir

log = logging.getLogger("queueserver.supervisor")

LAYOUT_FILE = "layout.json"
LAYOUT_FORMAT = 1
HASH_RULE = "xxh64(name) % shards"


class Layout(TypedDict):
    """``layout.json``, as :func:`read_layout` checked it."""
    format: int
    shards: int
    hash: str


class LayoutError(Exception):
    """The data directory cannot be used as asked (one line saying why and what to do)."""


def _reason(err: OSError) -> str:
    return (err.strerror or str(err)).lower()


def make_data_dir(path: str) -> None:
    """Create the data directory if missing; :class:`LayoutError` if it cannot be
    one (a regular file says so, rather than "file exists")."""
    if os.path.exists(path) and not os.path.isdir(path):
        raise LayoutError(f"data directory {path} is not a directory (pick another with --data-dir)")
    try:
        os.makedirs(path, mode=0o700, exist_ok=True)
    except OSError as err:
        raise LayoutError(f"cannot create data directory {path}: {_reason(err)}") from None


def _user(uid: int) -> str:
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return f"uid {uid}"


def _unusable(data_dir: str, path: str, err: OSError) -> LayoutError:
    """One line: what cannot be used, why, and (when another user owns it) whose it is."""
    try:
        owner = os.stat(path).st_uid
    except OSError:
        owner = None
    me = os.geteuid()
    if owner is not None and owner != me:
        fix = (f"it belongs to {_user(owner)} and this server runs as {_user(me)}: give the data "
               f"directory to the server's user (chown -R {_user(me)} {data_dir}) or run the "
               f"server as {_user(owner)}")
    else:
        fix = "check its permissions and attributes (ls -l, lsattr)"
    return LayoutError(f"data directory {data_dir}: cannot use {path}: {_reason(err)}; {fix}")


def _check_writable_dir(data_dir: str, path: str) -> None:
    """``path``, if it exists, is a directory this user can list, enter and
    create files in (tried, not guessed from mode bits: an immutable
    directory or a missing capability fails here as it would in the shard)."""
    try:
        info = os.stat(path)
    except FileNotFoundError:
        return   # made by the shard, in a directory already checked
    except OSError as err:
        raise _unusable(data_dir, path, err) from None
    if not stat.S_ISDIR(info.st_mode):
        raise LayoutError(f"data directory {data_dir}: {path} is not a directory; move it away")
    probe = os.path.join(path, f".startup-check-{os.getpid()}.tmp")
    try:
        os.listdir(path)
        os.close(os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600))
        os.unlink(probe)
    except OSError as err:
        raise _unusable(data_dir, path, err) from None


def check_shard_files(data_dir: str, shards: int, history: bool = True) -> None:
    """:class:`LayoutError` unless every shard can read and write its files:
    its log directory and each file in it (a shard reads every segment, cuts
    a torn tail, removes obsolete ones), and, with ``history``, its history
    directory."""
    dirs = [shard_dir(data_dir, i) for i in range(shards)]
    if history:
        dirs += [os.path.join(data_dir, "history")]
        dirs += [os.path.join(data_dir, "history", f"shard-{i}") for i in range(shards)]
    if not all(os.path.isdir(path) for path in dirs):
        _check_writable_dir(data_dir, data_dir)   # a shard creates what is missing here
    for path in dirs:
        _check_writable_dir(data_dir, path)
    for directory in dirs[:shards]:
        if not os.path.isdir(directory):
            continue
        for name in sorted(os.listdir(directory)):
            path = os.path.join(directory, name)
            try:
                if not stat.S_ISREG(os.lstat(path).st_mode):
                    continue
                os.close(os.open(path, os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC))
            except FileNotFoundError:
                continue
            except OSError as err:
                raise _unusable(data_dir, path, err) from None


def read_layout(data_dir: str) -> Optional[Layout]:
    path = os.path.join(data_dir, LAYOUT_FILE)
    try:
        with open(path) as f:
            layout = json.load(f)
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as err:
        raise LayoutError(f"cannot read {path}: {err}") from None
    if not isinstance(layout, dict) or layout.get("format") != LAYOUT_FORMAT \
            or not isinstance(layout.get("shards"), int) or layout.get("hash") != HASH_RULE:
        raise LayoutError(f"{path} is not a layout this version understands "
                          f"(format {LAYOUT_FORMAT}, hash {HASH_RULE!r}); was it written by a newer "
                          f"queueserver?")
    return cast(Layout, layout)   # checked just above


def settle_layout(data_dir: str, shards: int, shards_given: bool) -> int:
    """Create ``data_dir`` if needed and return the shard count to run:
    the recorded one, or ``shards`` for a new directory (recorded now)."""
    make_data_dir(data_dir)
    layout = read_layout(data_dir)
    if layout is not None:
        recorded = layout["shards"]
        if shards_given and shards != recorded:
            raise LayoutError(f"data directory {data_dir} holds the jobs of {recorded} shards; start "
                              f"with --shards {recorded} (changing the shard count of a data "
                              f"directory would strand its jobs)")
        return recorded
    if any(name.startswith("shard-") for name in os.listdir(data_dir)):
        raise LayoutError(f"data directory {data_dir} holds shard logs but no {LAYOUT_FILE}; "
                          f"restore that file or use an empty directory")
    path = os.path.join(data_dir, LAYOUT_FILE)
    with open(path + ".tmp", "w") as f:
        json.dump({"format": LAYOUT_FORMAT, "shards": shards, "hash": HASH_RULE}, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(path + ".tmp", path)
    fd = os.open(data_dir, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
    return shards


class DataDir:
    """A data directory held by one server at a time (an exclusive ``flock``)."""

    def __init__(self, path: str) -> None:
        self.path = os.path.abspath(path)
        self._lock_fd: Optional[int] = None

    def acquire(self, shards: int, shards_given: bool, history: bool = True,
                may_reshard: bool = True) -> int:
        """Lock the directory, settle its layout and check that every shard
        can use its files (``history``: its history directory too); the
        shard count to run. A shard count given that differs from the
        directory's re-shards it first (``may_reshard``; a cluster node's
        shards are its cluster file's business)."""
        make_data_dir(self.path)
        try:
            self._lock_fd = lock_directory(self.path, "data directory", "--data-dir")
        except DirectoryBusy as err:
            raise LayoutError(str(err)) from None
        try:
            numbers = self.numbers_file()
            finish_interrupted(self.path, LAYOUT_FILE)
            layout = read_layout(self.path)
            older = layout is not None and not os.path.exists(numbers)
            if layout is not None and shards_given and shards != layout["shards"] and may_reshard:
                self._reshard(layout["shards"], shards, history, numbers)
                older = False   # every number made before is asked of every shard now
            shards = settle_layout(self.path, shards, shards_given)
            check_shard_files(self.path, shards, history)
            if older:   # written before job numbers came in blocks: each shard says its highest first
                NumberFile(numbers).start_upgrade(shards)
            return shards
        except LayoutError:
            self.release()
            raise
        except (NumbersError, OSError) as err:
            self.release()
            raise LayoutError(f"data directory {self.path}: {err}") from None

    def _reshard(self, old: int, new: int, history: bool, numbers: str) -> None:
        check_shard_files(self.path, old, history)
        log.info("data directory %s holds the jobs of %d shards; re-sharding it to %d (the old "
                 "shards stay as they are until the new ones are written)", self.path, old, new)
        try:
            reshard(self.path, old, new, {"format": LAYOUT_FORMAT, "shards": new, "hash": HASH_RULE},
                    LAYOUT_FILE, numbers)
        except (StoreError, OSError, NumbersError) as err:
            raise LayoutError(f"cannot re-shard data directory {self.path} from {old} to {new} shards: "
                              f"{err} (its {old} shards are as they were: start with --shards {old}, "
                              f"or mend the cause and start again)") from None

    def numbers_file(self) -> str:
        """The file of job number blocks (:mod:`queueserver.jobnumbers`)."""
        return os.path.join(self.path, NUMBERS_FILE)

    def shard_dir(self, index: int) -> str:
        return shard_dir(self.path, index)

    def history_dir(self, index: int) -> str:
        """Where shard ``index`` writes its job history (``queueserver history`` reads it)."""
        return os.path.join(self.path, "history", f"shard-{index}")

    @property
    def lock_fd(self) -> Optional[int]:
        """The descriptor holding the lock (children inherit it: see the supervisor)."""
        return self._lock_fd

    def release(self) -> None:
        if self._lock_fd is not None:
            os.close(self._lock_fd)
            self._lock_fd = None
