"""Which input bytes are already in the state: the checkpoint of incremental runs.

For each file read, the checkpoint keeps its size and modification time and
how far it was *consumed*: up to the end of its last complete line. A file
being written may end in part of a line; that part is left for the next
run, which reads a file again only when its size or time changed, and then
only from where it stopped. History files are only ever appended to, so a
file that got shorter than what was consumed is an error, not a guess.

The checkpoint also names the state generation (``_state/<gen>``) that
holds what those bytes added up to, and the running counts of lines that
were rejected, so that any sequence of runs reports what one run over
everything would. It is replaced in one rename, after the state and tables
are written: a run that dies before that leaves the previous checkpoint,
and the next run redoes its work.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Dict, List, Optional

from .errors import HistoryError

NAME = "_checkpoint.json"
#: 2: the job state keeps each job's first end (1 kept the latest final event)
FORMAT = 2


@dataclass(frozen=True)
class FileMark:
    """A file as last read: its size and mtime (µs) then, and the bytes taken from it."""
    size: int
    mtime: int
    consumed: int


@dataclass
class Checkpoint:
    state: Optional[str] = None
    files: Dict[str, FileMark] = field(default_factory=dict)
    records: int = 0
    malformed: int = 0
    versions: Dict[int, int] = field(default_factory=dict)

    @property
    def partial_lines(self) -> int:
        """Files whose last line is still incomplete (left for a later run)."""
        return sum(1 for mark in self.files.values() if mark.consumed < mark.size)

    def to_json(self) -> str:
        return json.dumps({
            "format": FORMAT, "state": self.state, "records": self.records,
            "malformed": self.malformed,
            "versions": {str(v): n for v, n in sorted(self.versions.items())},
            "files": {path: [m.size, m.mtime, m.consumed] for path, m in sorted(self.files.items())},
        }, indent=1)

    @classmethod
    def from_json(cls, text: str, where: str) -> "Checkpoint":
        try:
            data = json.loads(text)
            if data.get("format") != FORMAT:
                raise ValueError(f"format {data.get('format')!r}, expected {FORMAT}: "
                                 + ("an older queueserver history wrote it"
                                    if isinstance(data.get("format"), int) and data["format"] < FORMAT
                                    else "not one this version writes"))
            return cls(state=data["state"], records=int(data["records"]),
                       malformed=int(data["malformed"]),
                       versions={int(v): int(n) for v, n in data["versions"].items()},
                       files={path: FileMark(*map(int, mark)) for path, mark in data["files"].items()})
        except (ValueError, KeyError, TypeError) as err:
            raise unusable(where, err) from None


def unusable(where: str, why: object) -> HistoryError:
    """The error for a checkpoint that cannot be used, with the way out."""
    return HistoryError(f"cannot use the checkpoint {where} ({why}); "
                        "run again with --rebuild to read every file anew")


@dataclass(frozen=True)
class Listed:
    """A file as the listing saw it (size in bytes, mtime in µs)."""
    path: str
    size: int
    mtime: int


@dataclass(frozen=True)
class Plan:
    """The files to read this run: new ones from their start, changed ones from their offset."""
    new: List[str]
    grown: Dict[str, int]

    @property
    def paths(self) -> List[str]:
        return self.new + sorted(self.grown)


def plan(checkpoint: Checkpoint, listed: List[Listed]) -> Plan:
    """What of ``listed`` the checkpoint has not consumed yet."""
    new: List[str] = []
    grown: Dict[str, int] = {}
    for item in sorted(listed, key=lambda f: f.path):
        mark = checkpoint.files.get(item.path)
        if mark is None:
            new.append(item.path)
        elif item.size < mark.consumed:
            raise HistoryError(f"{item.path} shrank from {mark.consumed} to {item.size} bytes, but "
                               "history files are only appended to; run again with --rebuild "
                               "to read every file anew")
        elif (item.size, item.mtime) != (mark.size, mark.mtime):
            grown[item.path] = mark.consumed
    return Plan(new, grown)
