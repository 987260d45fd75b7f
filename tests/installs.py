"""Real installs of the package, apart from the suite's own: which modules
setup.py compiles, whether this machine can compile them, and what an
install's ``queueserver --version`` says, run as an operator would (its
own venv's script, nothing of the suite's path).
"""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import sysconfig
from typing import Dict, List

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def compiled_sources() -> List[str]:
    """The modules setup.py compiles, as ``queueserver/engine/engine.py``."""
    with open(os.path.join(REPO, "setup.py")) as f:
        return sorted(set(re.findall(r'"(queueserver/[a-z_/]+\.py)"', f.read())))


def can_compile() -> bool:
    """A C compiler and Python's headers: what setup.py needs to compile (as ``make test``'s machine has)."""
    return shutil.which(os.environ.get("CC", "cc")) is not None and \
        os.path.exists(os.path.join(sysconfig.get_paths()["include"], "Python.h"))


def outside_env() -> Dict[str, str]:
    """This environment without what would put the suite's tree or venv before
    an install's own files, or run a compiled install as plain Python."""
    return {key: value for key, value in os.environ.items()
            if key not in ("PYTHONPATH", "VIRTUAL_ENV", "QS_PURE_PYTHON", "PYTHONHOME")}


def version(venv: str, cwd: str) -> List[str]:
    """``queueserver --version`` of the install in ``venv``: its lines."""
    done = subprocess.run([os.path.join(venv, "bin", "queueserver"), "--version"], capture_output=True,
                          text=True, env=outside_env(), cwd=cwd, timeout=60)
    assert done.returncode == 0, done.stderr
    return done.stdout.splitlines()


def site_packages(venv: str) -> str:
    """The venv's site-packages folder."""
    lib = os.path.join(venv, "lib")
    (python,) = [name for name in os.listdir(lib) if name.startswith("python")]
    return os.path.join(lib, python, "site-packages")
