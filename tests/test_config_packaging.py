"""The package installs through its declared build backend (PEP 517/660),
never through the deprecated ``setup.py install``/``develop`` paths."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest

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
    result = subprocess.run([*pip, "install", "--no-deps", "-e", str(project)], capture_output=True,
                            text=True, timeout=240)
    output = result.stdout + result.stderr
    assert result.returncode == 0, output
    assert "(pyproject.toml)" in output
    for legacy in ("setup.py develop", "setup.py install", "DEPRECATION"):
        assert legacy not in output
    check = subprocess.run([str(venv / "bin" / "queueserver"), "--version"], capture_output=True, text=True)
    assert check.stdout.startswith("queueserver ")
