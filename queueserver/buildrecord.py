"""The compile's record of its sources: a line per compiled module,
``<hash>  queueserver/engine/engine.py``, written beside the compiled
modules by the build (``setup.py``) and compared with the sources present
at every import of the package (``queueserver/__init__.py``).

By content, not by modification time: pip gives each file it installs the
time of the install, in the wheel's order, so a source written a moment
after its compiled module says nothing about which is newer. The hash is
the one Python's own hash-checked ``.pyc`` files carry for the same
question (``importlib.util.source_hash``, PEP 552): 64-bit SipHash, about
0.1 ms for all the compiled sources, nothing to import (``hashlib`` would
add 2 ms to each process's start). It is keyed by the Python version, as
the compiled modules themselves are built for one.

It imports nothing of the package: ``setup.py`` loads this file on its own,
before anything is built, and it is never compiled.
"""
from __future__ import annotations

import os
from importlib.util import source_hash
from typing import Dict, Iterable

#: the record's file name, in the package's folder
NAME = "compiled-sources.txt"
HEADER = "# importlib.util.source_hash of each compiled module's source, as the build read it\n"


def digest(path: str) -> str:
    """The hash of a file's bytes, in hex."""
    with open(path, "rb") as f:
        return source_hash(f.read()).hex()


def text(sources: Iterable[str], root: str) -> str:
    """The record of ``sources``, paths relative to ``root`` (the folder above the package)."""
    return HEADER + "".join(f"{digest(os.path.join(root, source))}  {source}\n" for source in sources)


def parse(record: str) -> Dict[str, str]:
    """``{source: hash}`` from a record's text; ValueError if a line is not ``<hash>  <path>``."""
    found = {}
    for line in record.splitlines():
        if line.startswith("#"):
            continue
        digest_hex, sep, source = line.partition("  ")
        if not sep or len(digest_hex) != 16 or not source:
            raise ValueError(f"not a '<hash>  <path>' line: {line!r}")
        found[source] = digest_hex
    return found
