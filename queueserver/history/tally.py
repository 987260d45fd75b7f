"""What one run read: lines per kind, records per unknown version, and each file's new mark.

Both engines classify every line they read as one of the kinds below and
hand the counts per file, kind and version to :meth:`Tally.of`, so the
checkpoint's marks and the rejected counts are made one way.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict, Iterable, Mapping

from .checkpoint import FileMark

PATTERN = "*.jsonl"
# Line kinds.
EVENT, BLANK, PARTIAL, MALFORMED, OTHER_VERSION = "event", "blank", "partial", "malformed", "version"


@dataclass
class Tally:
    """Lines read per kind, records per unknown version, and each file's new mark."""
    kinds: Dict[str, int] = field(default_factory=dict)
    versions: Dict[int, int] = field(default_factory=dict)
    marks: Dict[str, FileMark] = field(default_factory=dict)
    starts: Dict[str, int] = field(default_factory=dict)

    @property
    def records(self) -> int:
        return self.kinds.get(EVENT, 0)

    @property
    def malformed(self) -> int:
        return self.kinds.get(MALFORMED, 0)

    @property
    def bytes_read(self) -> int:
        return sum(mark.size - self.starts[path] for path, mark in self.marks.items())

    @classmethod
    def of(cls, rows: Iterable[Mapping[str, object]]) -> "Tally":
        """From rows of (``path``, ``kind``, ``version``, ``lines``, ``size``, ``mtime``, ``start``,
        ``partial``): per file and kind, its line count, the file's size and mtime as read,
        where reading started, and the bytes of a partial last line (left for the next run)."""
        tally = cls()
        partial: Dict[str, int] = {}
        for r in rows:
            path, kind, lines = str(r["path"]), str(r["kind"]), int(r["lines"])  # type: ignore[call-overload]
            tally.kinds[kind] = tally.kinds.get(kind, 0) + lines
            if kind == OTHER_VERSION:
                version = int(r["version"])  # type: ignore[call-overload]
                tally.versions[version] = tally.versions.get(version, 0) + lines
            partial[path] = partial.get(path, 0) + int(r["partial"])  # type: ignore[call-overload]
            tally.marks[path] = FileMark(int(r["size"]), int(r["mtime"]), 0)  # type: ignore[call-overload]
            tally.starts[path] = int(r["start"])  # type: ignore[call-overload]
        for path, mark in tally.marks.items():
            tally.marks[path] = FileMark(mark.size, mark.mtime, mark.size - partial[path])
        return tally
