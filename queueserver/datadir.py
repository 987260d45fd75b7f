"""The data directory: one log directory per shard, and the layout that
says which shard owns which queues.

Queue names map to shards by ``shard_for(name, shards)``, so the jobs in a
data directory are only where a server looks for them when it runs the
same number of shards that wrote them. ``layout.json`` records that number
(and the hash rule) the first time a durable server starts; later starts
keep it: with no shard count given, the recorded one is used, and a
different one given explicitly is refused with one line rather than
leaving jobs on shards nobody asks.
"""
from __future__ import annotations

import json
import os
from typing import Optional

from .dirlock import DirectoryBusy, lock_directory
from .store import shard_dir

LAYOUT_FILE = "layout.json"
LAYOUT_FORMAT = 1
HASH_RULE = "xxh64(name) % shards"


class LayoutError(Exception):
    """The data directory cannot be used as asked (one line saying why and what to do)."""


def read_layout(data_dir: str) -> Optional[dict]:
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
    return layout


def settle_layout(data_dir: str, shards: int, shards_given: bool) -> int:
    """Create ``data_dir`` if needed and return the shard count to run:
    the recorded one, or ``shards`` for a new directory (recorded now)."""
    try:
        os.makedirs(data_dir, mode=0o700, exist_ok=True)
    except OSError as err:
        raise LayoutError(f"cannot create data directory {data_dir}: "
                          f"{(err.strerror or str(err)).lower()}") from None
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

    def acquire(self, shards: int, shards_given: bool) -> int:
        """Lock the directory and settle its layout; the shard count to run."""
        try:
            os.makedirs(self.path, mode=0o700, exist_ok=True)
        except OSError as err:
            raise LayoutError(f"cannot create data directory {self.path}: "
                              f"{(err.strerror or str(err)).lower()}") from None
        try:
            self._lock_fd = lock_directory(self.path, "data directory", "--data-dir")
        except DirectoryBusy as err:
            raise LayoutError(str(err)) from None
        try:
            return settle_layout(self.path, shards, shards_given)
        except LayoutError:
            self.release()
            raise

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
