"""Every install runs the compiled hot path unless a source is not the one
compiled, and says which it runs (``queueserver --version``, ``/status``).

``queueserver/__init__.py`` compares the sources present with the record
the build wrote beside the compiled modules (their hashes), not with the
modules' times: pip gives each installed file the install's time, in the
wheel's order, so every non-editable install once ran as plain Python.

First the decision on package folders laid out as a build leaves them (no
compile: empty files stand for the compiled modules, which deciding never
imports); then real installs, the Dockerfile's steps and the systemd
recipe's, built from the checkout once (one full compile, minutes) in one
test, so that test processes running side by side never build it twice.
"""
from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
from importlib.machinery import EXTENSION_SUFFIXES
from pathlib import Path
from typing import List, Tuple

import pytest

import dockerfile
from installs import REPO, can_compile, compiled_sources, outside_env, site_packages, version
from queueserver import __version__, buildrecord
from serverproc import ServerProcess, http_get

SOURCES = {"queueserver/placement.py": "SHARDS = 1\n",
           "queueserver/engine/__init__.py": "",
           "queueserver/engine/engine.py": "def cycle() -> int:\n    return 1\n"}
COMPILED = ("queueserver/placement.py", "queueserver/engine/engine.py")
SUFFIX = EXTENSION_SUFFIXES[0]
REINSTALL = "install it again from the checkout: pip install <checkout>"


def _built(source: str) -> str:
    return source[:-len(".py")] + SUFFIX


def _layout(tmp_path: Path) -> Path:
    """A folder holding the package as a compiled build leaves it: the real
    ``__init__.py`` and ``buildrecord.py``, sources, an empty file for each
    compiled module, and the record of the sources (as setup.py writes it)."""
    root = tmp_path / "site-packages"
    for name in ("__init__.py", "buildrecord.py"):
        (root / "queueserver").mkdir(parents=True, exist_ok=True)
        (root / "queueserver" / name).write_bytes((Path(REPO) / "queueserver" / name).read_bytes())
    for source, text in SOURCES.items():
        (root / source).parent.mkdir(parents=True, exist_ok=True)
        (root / source).write_text(text)
    for source in COMPILED:
        (root / _built(source)).write_bytes(b"")
    (root / "queueserver" / buildrecord.NAME).write_text(buildrecord.text(COMPILED, str(root)))
    return root


def _decide(root: Path, module: str = "queueserver") -> Tuple[bool, str, str]:
    """``(COMPILED, WHY_PURE, module's file)`` as a process importing the package from ``root`` decides."""
    code = ("import importlib, json, queueserver as q; "
            f"print(json.dumps([q.COMPILED, q.WHY_PURE, importlib.import_module({module!r}).__file__]))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=root.parent,
                          env={**outside_env(), "PYTHONPATH": str(root)}, timeout=60)
    assert done.returncode == 0, done.stderr
    compiled, why, path = json.loads(done.stdout)
    assert path.startswith(str(root)), path
    return compiled, why, os.path.relpath(path, root)


def _set_mtime(path: Path, when: float) -> None:
    os.utime(path, (when, when))


def test_a_source_newer_than_its_compiled_module_is_still_the_one_compiled(tmp_path):
    """The sources written a second after their compiled modules, as pip may
    install them: compiled (by time, this was 'changed since it was compiled')."""
    root = _layout(tmp_path)
    for source in COMPILED:
        _set_mtime(root / source, (root / _built(source)).stat().st_mtime + 1)
    assert _decide(root)[:2] == (True, None)


def test_an_edited_source_runs_plain_python_and_is_named(tmp_path):
    """An edit, even one that keeps an older time (``cp -p``, a restored
    backup): plain Python, the edited file named, and how to build again
    (a checkout, beside setup.py: make; an install: install it again)."""
    root = _layout(tmp_path)
    engine = root / "queueserver/engine/engine.py"
    before = engine.stat().st_mtime
    engine.write_text(engine.read_text() + "# edited\n")
    _set_mtime(engine, before - 60)
    assert engine.stat().st_mtime < (root / _built("queueserver/engine/engine.py")).stat().st_mtime
    # the sources run, not the compiled modules (an empty file here: importing it would fail)
    assert _decide(root, "queueserver.engine.engine") == (
        False, f"queueserver/engine/engine.py changed since it was compiled ({REINSTALL})",
        "queueserver/engine/engine.py")
    (root / "setup.py").write_text("")
    assert _decide(root)[1] == ("queueserver/engine/engine.py changed since it was compiled "
                                "(build again: make, or pip install -e .)")


def test_a_build_the_record_does_not_describe_runs_plain_python(tmp_path):
    """A compiled module the record does not name (left by an older build),
    a recorded one gone, no record at all: plain Python, saying which."""
    root = _layout(tmp_path)
    (root / "queueserver" / "old.py").write_text("")
    (root / _built("queueserver/old.py")).write_bytes(b"")
    assert _decide(root)[:2] == (False, f"{_built('queueserver/old.py')} is not of the last build (its record "
                                        f"does not name queueserver/old.py): remove it, or {REINSTALL}")
    (root / _built("queueserver/old.py")).unlink()
    (root / _built("queueserver/placement.py")).unlink()
    assert _decide(root)[:2] == (False, f"queueserver/placement.py or its compiled module is missing: {REINSTALL}")
    root = _layout(tmp_path / "again")
    (root / "queueserver" / buildrecord.NAME).unlink()
    compiled, why, _ = _decide(root)
    assert not compiled and why.startswith(f"the compiled modules came without {buildrecord.NAME}, "), why
    (root / "queueserver" / buildrecord.NAME).write_text("not a record\n")
    assert _decide(root)[1].startswith(f"{buildrecord.NAME} cannot be read (not a '<hash>  <path>' line: ")


# ------------------------------------------------------------ real installs
#: the units whose header says how to install the package
UNITS = ("queueserver.service", "queueserver-node@.service")


def _recipe(unit: str) -> List[List[str]]:
    """The commands of the unit's install recipe (its header) that make the venv and install the package."""
    with open(os.path.join(REPO, "deploy", "systemd", unit)) as f:
        header = f.read().split("\n[", 1)[0]
    commands = []
    for line in header.splitlines():
        if " -m venv " in line or "/bin/pip install " in line:
            commands.append(shlex.split(line.lstrip("#"), comments=True))
    return commands


class _InstalledServer(ServerProcess):
    """The server as an install runs it: its venv's ``queueserver`` script."""

    def __init__(self, venv: str) -> None:
        super().__init__(protocols=["workq"])
        self.venv = venv

    def argv(self) -> List[str]:
        argv = super().argv()
        assert argv[1:3] == ["-m", "queueserver"], argv
        return [os.path.join(self.venv, "bin", "queueserver"), *argv[3:]]


@pytest.mark.timeout(900)
def test_every_non_editable_install_runs_compiled(tmp_path, monkeypatch):
    """The Dockerfile's steps (a wheel built from the checkout, installed in
    a fresh Python) and the systemd recipe (``pip install <checkout>`` into a
    fresh venv) both run compiled, as its server's every process and
    ``/status`` say; then an edited source of an install runs plain Python,
    named. One full compile: the recipe installs the checkout the Dockerfile's
    build stage copied and built in (pip builds in the tree, so it compiles
    only the C that mypyc wrote anew, as a checkout installed twice would)."""
    if not can_compile():
        pytest.skip("no C compiler or no Python headers here: every install is plain Python by design")
    compiled = f"compiled (mypyc): {len(compiled_sources())} modules"
    env = outside_env()

    # The Dockerfile: its stages' COPY and RUN steps as they are written. Its
    # build stage's image has no C compiler of its own (python:*-slim): it installs one.
    steps = dockerfile.instructions()
    build_runs = [args for word, args in steps[:[w for w, _ in steps].index("FROM", 1)] if word == "RUN"]
    assert any(run.startswith("apt-get ") and " gcc " in run and " libc6-dev" in run for run in build_runs)
    stages = dockerfile.replay_install(str(tmp_path / "docker"), env)
    image = list(stages.values())[-1]
    assert version(image.venv, str(tmp_path)) == [f"queueserver {__version__}", compiled]
    # Times say nothing: every source made newer than every compiled module, still compiled.
    site = Path(site_packages(image.venv))
    newest = max(path.stat().st_mtime for path in site.glob(f"queueserver/**/*{SUFFIX}"))
    for source in compiled_sources():
        _set_mtime(site / source, newest + 1)
    assert version(image.venv, str(tmp_path))[1] == compiled

    # Its server: /status says compiled, and each of its processes runs the compiled modules.
    for name in ("PYTHONPATH", "VIRTUAL_ENV", "QS_PURE_PYTHON"):
        monkeypatch.delenv(name, raising=False)
    # Run from the checkout (its sources, and maybe its own compiled build,
    # right there): the children still import the install's package.
    monkeypatch.chdir(REPO)
    with _InstalledServer(image.venv) as server:
        status = json.loads(http_get(server, "/status"))
        assert (status["compiled"], status["why_pure"]) == (True, None)
        children = server.child_pids()
        assert {"shard-0", "router"} <= set(children), children
        for name, pid in children.items():
            with open(f"/proc/{pid}/maps") as f:
                mapped = {line.split()[-1] for line in f if line.rstrip().endswith(SUFFIX)}
            assert any(path.startswith(f"{site}/queueserver/") for path in mapped), \
                f"{name} runs no compiled module of the install: {sorted(mapped)}"

    # The systemd recipe, the same in both units and in docs/deployment.md (run from the checkout there).
    recipe = _recipe(UNITS[0])
    assert len(recipe) == 2 and all(_recipe(unit) == recipe for unit in UNITS[1:]), recipe
    with open(os.path.join(REPO, "docs", "deployment.md")) as f:
        docs = f.read()
    assert shlex.join(recipe[0]) in docs and shlex.join(recipe[1]).replace("/path/to/checkout", ".") in docs
    checkout = stages["build"].host(".")
    host = tmp_path / "host"
    for argv in recipe:
        argv = [sys.executable if arg == "python3" else checkout if arg == "/path/to/checkout"
                else f"{host}{arg}" if arg.startswith("/opt/") else arg for arg in argv]
        done = subprocess.run(argv, capture_output=True, text=True, env=env, cwd=tmp_path)
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-5000:]
    venv = str(host / "opt" / "queueserver" / ".venv")
    assert version(venv, str(tmp_path)) == [f"queueserver {__version__}", compiled]

    # An installed source edited (keeping an older time than its compiled module): plain Python, named.
    engine = Path(site_packages(venv)) / "queueserver" / "engine" / "engine.py"
    before = engine.stat().st_mtime
    engine.write_text(engine.read_text() + "# edited\n")
    _set_mtime(engine, before - 60)
    assert version(venv, str(tmp_path))[1] == \
        f"plain Python: queueserver/engine/engine.py changed since it was compiled ({REINSTALL})"
