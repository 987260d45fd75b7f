"""queueserver: one job store behind five queue-server wire protocols.

The modules every request passes through are compiled to C with mypyc when
the package is built (see ``setup.py``); this file, never compiled, decides
whether the compiled modules or their Python sources run. Plain Python runs
when ``QS_PURE_PYTHON`` is set (to anything but ``0``), or when a compiled
module is older than its source (a checkout edited since its last build:
the old code must not run), and always for all of them at once: compiled
modules call each other natively and cannot be mixed with their sources.
:data:`COMPILED` says which it is, :data:`WHY_PURE` why not compiled.
"""
from __future__ import annotations

import importlib.util
import os
import sys
from importlib.machinery import EXTENSION_SUFFIXES, ModuleSpec
from types import ModuleType
from typing import List, Optional, Sequence, Tuple

__version__ = "0.1.0"

_HERE = os.path.dirname(os.path.abspath(__file__))


def _compiled_builds() -> List[Tuple[str, str]]:
    """``(source, compiled build)`` of every module of this package that has one beside it."""
    found = []
    for folder, _, names in os.walk(_HERE):
        for name in names:
            for suffix in EXTENSION_SUFFIXES:
                if name.endswith(suffix):
                    source = os.path.join(folder, name[:-len(suffix)] + ".py")
                    if os.path.exists(source):
                        found.append((source, os.path.join(folder, name)))
    return found


def _why_pure(builds: Sequence[Tuple[str, str]]) -> Optional[str]:
    if os.environ.get("QS_PURE_PYTHON", "0") not in ("", "0"):
        return "QS_PURE_PYTHON is set"
    if not builds:
        return ("the package was built without compiling (QS_PURE_PYTHON at build time, or no C compiler, "
                "Python headers or mypyc, or the compile failed: its output says which)")
    for source, built in builds:
        if os.path.getmtime(built) < os.path.getmtime(source):
            return (f"{os.path.relpath(source, os.path.dirname(_HERE))} changed since it was compiled "
                    f"(build again: pip install -e . or make)")
    return None


class _Sources:
    """Finds this package's modules as their ``.py`` sources, never their
    compiled builds (first on ``sys.meta_path`` when plain Python runs)."""

    @staticmethod
    def find_spec(name: str, path: Optional[Sequence[str]] = None,
                  target: Optional[ModuleType] = None) -> Optional[ModuleSpec]:
        if not name.startswith(__name__ + ".") or not path:
            return None
        leaf = name.rpartition(".")[2]
        for folder in path:
            source = os.path.join(folder, leaf + ".py")
            if os.path.isfile(source):
                return importlib.util.spec_from_file_location(name, source)
        return None   # a subpackage: its __init__.py is found as usual


_BUILDS = _compiled_builds()
#: why the Python sources run instead of the compiled modules (None: compiled)
WHY_PURE = _why_pure(_BUILDS)
#: whether the compiled (mypyc) modules run
COMPILED = WHY_PURE is None
if not COMPILED and _BUILDS:
    sys.meta_path.insert(0, _Sources())
