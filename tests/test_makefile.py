"""The Makefile's venv handling, run for real on copies of the build files:
`make run` installs nothing when the installed package is up to date, a
wrong or missing Python is one line before anything is made, a venv made
half-way is made again, and an editable install prints no setuptools
warning."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BUILD_FILES = ("setup.cfg", "setup.py", "pyproject.toml")
SERVE = ".venv/bin/queueserver serve --data-dir ./data"
#: the Python this venv was made from (the venv's python is a link to it)
BASE_PYTHON = os.path.realpath(sys.executable)


def tree(tmp_path):
    """The Makefile and the build files, as in a checkout."""
    tmp_path.mkdir(exist_ok=True)
    for name in ("Makefile", *BUILD_FILES):
        shutil.copy(os.path.join(ROOT, name), tmp_path / name)
    return tmp_path


def make(where, *args: str, **env: str) -> subprocess.CompletedProcess:
    environ = {k: v for k, v in os.environ.items() if not k.startswith("MAKE")}
    environ.update(env)
    return subprocess.run(["make", "--no-print-directory", *args], cwd=where, capture_output=True,
                          text=True, timeout=300, env=environ)


def stamp(where, *names: str) -> None:
    """Stamps as a successful make leaves them: newer than every build file."""
    newest = max(os.stat(where / name).st_mtime for name in BUILD_FILES)
    (where / ".venv").mkdir(exist_ok=True)
    for name in names:
        (where / ".venv" / name).touch()
        os.utime(where / ".venv" / name, (newest + 10, newest + 10))


def commands(result: subprocess.CompletedProcess):
    assert result.returncode == 0, result.stderr
    return [line.strip() for line in result.stdout.splitlines() if line.strip()]


def test_run_with_the_package_installed_installs_nothing(tmp_path):
    where = tree(tmp_path)
    stamp(where, ".made", ".installed", ".built")
    assert commands(make(where, "-n", "run")) == [SERVE]
    assert commands(make(where, "-n", "run", "ARGS=--shards 4")) == [SERVE + " --shards 4"]


def test_a_changed_compiled_module_is_built_again(tmp_path):
    """A source that mypyc compiles, edited since the last build: the
    package is built again before it runs (a stale build would run as plain
    Python, slower); an edit to a module that is not compiled needs nothing."""
    where = tree(tmp_path)
    for name in ("engine/engine.py", "cli.py"):
        (where / "queueserver" / name).parent.mkdir(parents=True, exist_ok=True)
        (where / "queueserver" / name).write_text("")
    stamp(where, ".made", ".installed", ".built")
    assert commands(make(where, "-n", "run")) == [SERVE]
    later = os.stat(where / ".venv" / ".built").st_mtime + 10
    os.utime(where / "queueserver" / "cli.py", (later, later))
    assert commands(make(where, "-n", "run")) == [SERVE]
    os.utime(where / "queueserver" / "engine" / "engine.py", (later, later))
    assert commands(make(where, "-n", "run")) == [".venv/bin/pip install --quiet --no-deps -e .",
                                                  "touch .venv/.built", SERVE]


def test_a_changed_build_file_installs_again(tmp_path):
    where = tree(tmp_path)
    stamp(where, ".made", ".installed", ".installed-dev", ".built")
    later = os.stat(where / ".venv" / ".installed").st_mtime + 10
    os.utime(where / "setup.cfg", (later, later))
    assert commands(make(where, "-n", "run")) == [".venv/bin/pip install --quiet -e .",
                                                  "touch .venv/.installed .venv/.built", SERVE]
    assert ".venv/bin/pip install --quiet -e '.[dev,spark]'" in commands(make(where, "-n", "test"))


def test_the_dev_install_serves_run_too(tmp_path):
    where = tree(tmp_path)
    stamp(where, ".made")
    planned = commands(make(where, "-n", "test"))
    assert planned[:2] == [".venv/bin/pip install --quiet -e '.[dev,spark]'",
                           "touch .venv/.installed-dev .venv/.installed .venv/.built"]
    assert not any("-m venv" in line for line in planned)
    stamp(where, ".installed-dev", ".installed", ".built")
    assert commands(make(where, "-n", "run")) == [SERVE]
    assert all("pip" not in line for line in commands(make(where, "-n", "test")))


def fake_old_python(tmp_path) -> str:
    """A Python 3.9 as far as the Makefile can tell: anything it runs with -c
    sees version_info (3, 9, 18); anything else would run for real."""
    path = tmp_path / "python3.9"
    path.write_text("#!/bin/sh\n"
                    "if [ \"$1\" = -c ]; then\n"
                    f"  exec {BASE_PYTHON} -c 'import sys; sys.version_info = (3, 9, 18, \"final\", 0); "
                    "exec(sys.argv[1])' \"$2\"\n"
                    "fi\n"
                    f"exec {BASE_PYTHON} \"$@\"\n")
    path.chmod(0o755)
    return str(path)


def one_line(result: subprocess.CompletedProcess) -> str:
    assert result.returncode != 0, result.stdout
    assert result.stdout == "", result.stdout   # not a command run
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    return lines[0]


def test_an_old_python_is_one_line_and_makes_nothing(tmp_path):
    where = tree(tmp_path / "tree")
    old = fake_old_python(tmp_path)
    for goal in ("run", "test"):
        line = one_line(make(where, goal, f"PYTHON={old}"))
        assert line.endswith(f"*** {old} is Python 3.9.18: queueserver needs Python 3.11 or newer; "
                             f"install one and name it, e.g. make run PYTHON=python3.11.  Stop."), line
    assert not (where / ".venv").exists()


def test_a_python_that_is_not_there_is_one_line(tmp_path):
    where = tree(tmp_path)
    line = one_line(make(where, "run", "PYTHON=/nonexistent/python3"))
    assert "/nonexistent/python3 cannot be run: queueserver needs Python 3.11 or newer" in line, line
    assert not (where / ".venv").exists()


def test_a_venv_made_half_way_is_made_again(tmp_path):
    where = tree(tmp_path)
    # What an interrupted or failed venv creation leaves: a python, no pip, no stamp.
    subprocess.run([BASE_PYTHON, "-m", "venv", "--without-pip", str(where / ".venv")], check=True)
    assert any("-m venv .venv" in line for line in commands(make(where, "-n", "run")))
    made = make(where, ".venv/.made", f"PYTHON={BASE_PYTHON}")
    assert made.returncode == 0, made.stderr
    assert f"{BASE_PYTHON} -m venv .venv" in made.stdout
    assert subprocess.run([str(where / ".venv/bin/python"), "-c", "import pip"]).returncode == 0
    assert (where / ".venv" / ".made").exists()
    # A working venv from before the stamps is kept as it is.
    (where / ".venv" / ".made").unlink()
    kept = make(where, ".venv/.made", f"PYTHON={BASE_PYTHON}")
    assert kept.returncode == 0 and "keeping .venv" in kept.stdout, kept.stdout + kept.stderr


def test_an_editable_install_prints_no_setuptools_warning(tmp_path):
    """The package at the top of the tree, said so in setup.cfg: pip installs
    it editable with a .pth naming the tree, and setuptools warns of nothing."""
    where = tree(tmp_path / "tree")
    shutil.copy(os.path.join(ROOT, "README.md"), where / "README.md")
    shutil.copytree(os.path.join(ROOT, "queueserver"), where / "queueserver",
                    ignore=shutil.ignore_patterns("__pycache__", "*.so"))
    prefix = tmp_path / "prefix"
    # --ignore-installed: pip must not uninstall this venv's own editable
    # install of the package on the way (it would, --prefix or not)
    result = subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps",
                             "--ignore-installed", "--prefix", str(prefix), "-e", "."], cwd=where,
                            capture_output=True, text=True, timeout=300,
                            env={**os.environ, "QS_PURE_PYTHON": "1"})   # (no 2-minute compile)
    assert result.returncode == 0, result.stderr
    assert "Warning" not in result.stderr and "Editable installation" not in result.stderr, result.stderr
    pth = [os.path.join(top, name) for top, _, names in os.walk(prefix) for name in names
           if name.endswith(".pth")]
    assert len(pth) == 1, pth
    with open(pth[0]) as f:
        assert f.read().split() == [str(where)]
