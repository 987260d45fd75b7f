"""deploy/Dockerfile read as its instructions, and its install steps replayed
without Docker (none on the machines the suite runs on): each stage's ``/``
a folder of the test's, each stage's Python a fresh venv, the same commands.
"""
from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from typing import Callable, Dict, List, Tuple

ROOT = os.path.abspath(os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
DOCKERFILE = os.path.join(ROOT, "deploy", "Dockerfile")


def instructions(path: str = DOCKERFILE) -> List[Tuple[str, str]]:
    """(INSTRUCTION, arguments) in order: comments dropped, continuations joined."""
    result, pending = [], ""
    with open(path) as f:
        lines = f.read().splitlines()
    for line in lines:
        stripped = line.strip()
        if not stripped or stripped.startswith("#"):
            continue
        if stripped.endswith("\\"):
            pending += stripped[:-1] + " "
            continue
        whole = pending + stripped
        pending = ""
        word, _, rest = whole.partition(" ")
        result.append((word.upper(), rest.strip()))
    assert not pending, "a continuation line runs off the end"
    return result


def dockerignore(context: str = ROOT) -> List[str]:
    """The build context's .dockerignore patterns."""
    with open(os.path.join(context, ".dockerignore")) as f:
        return [line.strip() for line in f.read().splitlines() if line.strip() and not line.startswith("#")]


def _pattern(pattern: str) -> "re.Pattern[str]":
    """A .dockerignore pattern as a regex over a context-relative path: ``**``
    any number of folders, ``*`` and ``?`` within one name."""
    assert not pattern.startswith("!"), "exceptions (!) are not replayed"
    out = ""
    for part in re.split(r"(\*\*/?|\*|\?)", pattern.strip("/")):
        out += {"**/": "(?:.*/)?", "**": ".*", "*": "[^/]*", "?": "[^/]"}.get(part, re.escape(part))
    return re.compile(out + "(?:/.*)?")   # a folder's pattern leaves out all it holds


def _left_out(context: str, ignored: List["re.Pattern[str]"]) -> Callable[[str, List[str]], List[str]]:
    """copytree's ``ignore``: the names under ``context`` that .dockerignore keeps out."""
    def names(folder: str, found: List[str]) -> List[str]:
        rel = os.path.relpath(folder, context)
        return [name for name in found if any(p.fullmatch(os.path.normpath(os.path.join(rel, name)))
                                              for p in ignored)]
    return names


@dataclass
class Stage:
    """One ``FROM``: its ``/`` (``root``), working directory, ENV and Python (``venv``)."""
    name: str
    root: str
    venv: str
    workdir: str = "/"
    env: Dict[str, str] = field(default_factory=dict)

    def host(self, path: str) -> str:
        """Where a path of the image lies here."""
        return os.path.join(self.root, os.path.join(self.workdir, path).lstrip("/"))


def replay_install(where: str, env: Dict[str, str], context: str = ROOT,
                   path: str = DOCKERFILE) -> Dict[str, Stage]:
    """Replay the Dockerfile's build and install under ``where``: every stage's
    WORKDIR, COPY (with .dockerignore) and ENV, every RUN of the build stages
    and the final stage's ``RUN pip ...`` (its other RUNs make the user and
    its directories: root's work, no install), but no ``apt-get`` (the
    image's system packages: this machine has its own, whatever the caller
    checks); absolute paths in a RUN are the stage's. ``env``: the
    environment the commands start from. Returns the stages by name, in
    order: the last one's venv holds the install."""
    ignored = [_pattern(p) for p in dockerignore(context)]
    steps = instructions(path)
    final = max(i for i, (word, _) in enumerate(steps) if word == "FROM")
    stages: Dict[str, Stage] = {}
    stage = None
    for i, (word, args) in enumerate(steps):
        if word == "FROM":
            words = args.split()
            name = words[2] if len(words) > 2 and words[1].upper() == "AS" else f"stage{len(stages)}"
            stage = stages[name] = Stage(name, os.path.join(where, name), os.path.join(where, name + "-python"))
            os.makedirs(stage.root)
            subprocess.run([sys.executable, "-m", "venv", stage.venv], check=True, capture_output=True)
            continue
        assert stage is not None, f"{word} before FROM"
        if word == "WORKDIR":
            stage.workdir = os.path.join(stage.workdir, args)
            os.makedirs(stage.host("."), exist_ok=True)
        elif word == "ENV":
            stage.env.update(pair.split("=", 1) for pair in shlex.split(args))
        elif word == "COPY":
            *sources, dest = shlex.split(args)
            origin = stages[sources.pop(0).split("=", 1)[1]] if sources[0].startswith("--from=") else None
            for source in sources:
                from_path = origin.host(source) if origin is not None else os.path.join(context, source)
                to_path = stage.host(dest)
                if os.path.isdir(from_path):
                    shutil.copytree(from_path, to_path, dirs_exist_ok=True,
                                    ignore=None if origin is not None else _left_out(context, ignored))
                else:
                    if dest.endswith("/"):
                        to_path = os.path.join(to_path, os.path.basename(source))
                    os.makedirs(os.path.dirname(to_path), exist_ok=True)
                    shutil.copy2(from_path, to_path)
        elif word == "RUN" and (i < final or args.startswith("pip ")) and not args.startswith("apt-get "):
            command = re.sub(r"(?<=[\s=])/(?=\S)", stage.root + "/", " " + args)
            run_env = {**env, **stage.env, "PATH": os.path.join(stage.venv, "bin") + os.pathsep + env["PATH"]}
            done = subprocess.run(["bash", "-c", command], cwd=stage.host("."), env=run_env,
                                  capture_output=True, text=True)
            assert done.returncode == 0, f"RUN {args} failed:\n{done.stdout[-3000:]}{done.stderr[-5000:]}"
    assert stage is not None, "no FROM"
    return stages
