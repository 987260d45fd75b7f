"""queueserver: one job store behind five queue-server wire protocols.

The modules every request passes through are compiled to C with mypyc when
the package is built (see ``setup.py``); this file, never compiled, decides
whether the compiled modules or their Python sources run. Plain Python runs
when ``QS_PURE_PYTHON`` is set (to anything but ``0``), or when a source is
not the one its module was compiled from (an edited checkout or install:
the old code must not run), by its content against the build's record
(:mod:`.buildrecord`), and always for all of them at once: compiled modules
call each other natively and cannot be mixed with their sources.
:data:`COMPILED` says which it is, :data:`WHY_PURE` why not compiled,
:data:`BUILD` both in one line.
"""
from __future__ import annotations

import importlib.util
import os
import sys
from importlib.machinery import EXTENSION_SUFFIXES, ModuleSpec
from types import ModuleType
from typing import Dict, Optional, Sequence

from . import buildrecord

__version__ = "0.1.0"

_HERE = os.path.dirname(os.path.abspath(__file__))
#: the folder above the package, which the record's paths are relative to
_ROOT = os.path.dirname(_HERE)


def _compiled_builds() -> Dict[str, str]:
    """``{source: compiled build}`` of every module of this package that has one
    beside it, sources as the record names them (``queueserver/placement.py``)."""
    found = {}
    for folder, _, names in os.walk(_HERE):
        for name in names:
            for suffix in EXTENSION_SUFFIXES:
                if name.endswith(suffix):
                    source = os.path.join(folder, name[:-len(suffix)] + ".py")
                    if os.path.exists(source):
                        found[source[len(_ROOT) + 1:].replace(os.sep, "/")] = os.path.join(folder, name)
    return found


def _build_again() -> str:
    """How to get a build of the sources present: a checkout builds in place, an install is installed again."""
    if os.path.exists(os.path.join(_ROOT, "setup.py")):
        return "build again: make, or pip install -e ."
    return "install it again from the checkout: pip install <checkout>"


def _why_pure(builds: Dict[str, str]) -> Optional[str]:
    if os.environ.get("QS_PURE_PYTHON", "0") not in ("", "0"):
        return "QS_PURE_PYTHON is set"
    if not builds:
        return ("the package was built without compiling (QS_PURE_PYTHON at build time, or no C compiler, "
                "Python headers or mypyc, or the compile failed: its output says which)")
    try:
        with open(os.path.join(_HERE, buildrecord.NAME)) as f:
            recorded = buildrecord.parse(f.read())
    except FileNotFoundError:
        return (f"the compiled modules came without {buildrecord.NAME}, the record of the sources they "
                f"were compiled from (a build older than that record?): {_build_again()}")
    except (OSError, ValueError) as err:
        return f"{buildrecord.NAME} cannot be read ({err}): {_build_again()}"
    strays = sorted(builds.keys() - recorded.keys())
    if strays:   # (a module compiled once, no longer: the build left it beside its source)
        return (f"{os.path.relpath(builds[strays[0]], _ROOT)} is not of the last build (its record does not "
                f"name {strays[0]}): remove it, or {_build_again()}")
    for source, compiled_hash in recorded.items():
        if source not in builds:
            return f"{source} or its compiled module is missing: {_build_again()}"
        if buildrecord.digest(os.path.join(_ROOT, source)) != compiled_hash:
            return f"{source} changed since it was compiled ({_build_again()})"
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
#: which runs, and why, in one line (``queueserver --version``, ``make test``)
BUILD = f"compiled (mypyc): {len(_BUILDS)} modules" if COMPILED else f"plain Python: {WHY_PURE}"
if not COMPILED and _BUILDS:
    sys.meta_path.insert(0, _Sources())
