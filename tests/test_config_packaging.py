"""The package installs through its declared build backend (PEP 517/660),
never through the deprecated ``setup.py install``/``develop`` paths."""
from __future__ import annotations

import importlib
import os
import shutil
import subprocess
import sys

import pytest

import queueserver
from installs import can_compile, compiled_sources

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PROJECT_FILES = ("pyproject.toml", "setup.py", "setup.cfg", "README.md", "queueserver")


@pytest.mark.timeout(300)
def test_an_editable_install_uses_the_build_backend(tmp_path):
    project = tmp_path / "project"
    project.mkdir()
    for name in PROJECT_FILES:
        source = os.path.join(REPO, name)
        if os.path.isdir(source):
            shutil.copytree(source, project / name, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy(source, project / name)
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, capture_output=True)
    pip = [str(venv / "bin" / "python"), "-m", "pip", "--disable-pip-version-check"]
    # With wheel present, a pip that finds no declared build system falls back to `setup.py develop`.
    if subprocess.run([*pip, "install", "--quiet", "wheel"], capture_output=True).returncode != 0:
        pytest.skip("no package index reachable to install wheel")
    # (plain Python: the compiled build is `make test`'s own install, checked below)
    result = subprocess.run([*pip, "install", "--no-deps", "-e", str(project)], capture_output=True,
                            text=True, timeout=240, env={**os.environ, "QS_PURE_PYTHON": "1"})
    output = result.stdout + result.stderr
    assert result.returncode == 0, output
    assert "(pyproject.toml)" in output
    for legacy in ("setup.py develop", "setup.py install", "DEPRECATION"):
        assert legacy not in output
    check = subprocess.run([str(venv / "bin" / "queueserver"), "--version"], capture_output=True, text=True)
    assert check.stdout.startswith("queueserver ")


@pytest.mark.skipif(os.environ.get("QS_PURE_PYTHON", "0") not in ("", "0"), reason="plain Python asked for")
def test_the_installed_hot_path_is_compiled():
    """Where a C compiler and Python's headers are (they are wherever
    ``make test`` runs), the install compiled every module setup.py names,
    and those compiled modules are what runs: a build that silently fell
    back to plain Python, or a stale one, fails here."""
    if not can_compile():
        pytest.skip("no C compiler or no Python headers here: the install is plain Python by design")
    assert queueserver.COMPILED, queueserver.WHY_PURE
    modules = compiled_sources()
    assert len(modules) >= 30
    for path in modules:
        module = importlib.import_module(path[:-len(".py")].replace("/", "."))
        assert module.__file__ is not None and module.__file__.endswith(".so"), (path, module.__file__)


def test_plain_python_runs_the_sources():
    """QS_PURE_PYTHON=1 at run time: the same install runs its .py sources."""
    code = ("import queueserver, queueserver.engine.engine as e; "
            "print(queueserver.COMPILED, queueserver.WHY_PURE, e.__file__)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         env={**os.environ, "QS_PURE_PYTHON": "1"}).stdout.split()
    assert out[0] == "False" and "QS_PURE_PYTHON" in " ".join(out[1:]), out
    assert out[-1].endswith("engine.py"), out
