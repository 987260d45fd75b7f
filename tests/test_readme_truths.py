"""The README and the reference in docs/ say what is true of the code they describe.

Checked against the real thing: the usage lines and every long option that
``queueserver [<command>] --help`` prints (run as real processes) and every
key the configuration accepts, in docs/configuration.md; the Makefile's
``run`` recipe, in the README; and none of the statements that became
untrue (no durability, slot moves not built, a ``pip install queueserver``
of a package nobody published) nor references to documents a reader does
not have, in the README or any page of docs/. The prerequisites a newcomer
needs are stated in the README, which still opens with its two commands.

``QS_README=/path/to/README.md`` and ``QS_DOCS=/path/to/docs`` check other
copies (e.g. an older README: ``git show 7dd9584:README.md >
/tmp/old_readme.md``, which must fail).
"""
from __future__ import annotations

import os
import re
import subprocess
import sys
import tomllib
from pathlib import Path
from typing import Dict

import pytest

from queueserver.config import CODEC_OPTIONS, HISTORY, LISTENER, METRICS, SERVER, TLS, TLS_LISTENER, Config
from queueserver.protocols import DEFAULT_PORTS

ROOT = Path(__file__).resolve().parents[1]
README = Path(os.environ.get("QS_README", ROOT / "README.md"))
DOCS = Path(os.environ.get("QS_DOCS", ROOT / "docs"))
#: Where the command line and the configuration are described.
CONFIGURATION = DOCS / "configuration.md"
#: Every text a reader reads: the README and each page of the reference.
TEXTS = [README, *sorted(DOCS.glob("*.md"))]
COMMANDS = ("serve", "worker", "history", "cluster")

OPENING = """```sh
make run    # creates .venv, installs the package, starts the server on its defaults
make test   # installs the dev extras, runs the whole test suite
```
"""

#: Statements that are no longer true, and references to what a reader cannot read.
UNTRUE = {
    r"Durability is not there yet": "the shards keep an append-only log (Durability)",
    r"restarted shard starts empty": "a restarted shard replays its log",
    r"not yet built": "slot moves and re-sharding exist",
    r"pip install queueserver\b": "nothing is published on PyPI",
    r"goqueue's `DELETE <number>` ask every shard": "numbers come in blocks; the block names the shard",
    r"the highest number made is part of the log": "numbers come in blocks from the numbers file",
    r"refuse a different one": "another shard count re-shards the data directory",
    r"\bseeds?\b": "'the seed' is a document the reader does not have",
    r"decisions file|protocol decisions": "the decisions file is not the reader's",
    r"\bissue \d+": "the reader has no issue tracker of ours",
    r"speed issue": "the reader has no issue tracker of ours",
    r"\bsection \(?\d+\)?": "numbered sections of documents the reader does not have",
}


@pytest.fixture(scope="module")
def readme() -> str:
    return README.read_text(encoding="utf-8")


@pytest.fixture(scope="module")
def reference() -> str:
    """docs/configuration.md: the commands, their options and every configuration key."""
    return CONFIGURATION.read_text(encoding="utf-8")


@pytest.fixture(scope="module")
def helps() -> Dict[str, str]:
    """What ``queueserver [<command>] --help`` prints, each a real process (run together)."""
    env = {**os.environ, "COLUMNS": "80"}
    procs = {name: subprocess.Popen([sys.executable, "-m", "queueserver", *([name] if name else []), "--help"],
                                    stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                                    cwd=ROOT)
             for name in ("", *COMMANDS)}
    out = {}
    for name, proc in procs.items():
        stdout, stderr = proc.communicate(timeout=60)
        assert proc.returncode == 0, f"queueserver {name} --help: {stderr}"
        out[name] = stdout
    return out


def squeeze(text: str) -> str:
    return " ".join(text.split())


def test_opens_with_the_two_commands(readme):
    assert readme.startswith(OPENING)


@pytest.mark.parametrize("command", ["", *COMMANDS])
def test_usage_lines_are_the_real_ones(reference, helps, command):
    usage = helps[command].split("\n\n")[0]
    assert usage.startswith("usage: queueserver"), usage
    assert squeeze(usage) in squeeze(reference), \
        f"{CONFIGURATION.name} lacks the real usage of queueserver {command}:\n{usage}"


@pytest.mark.parametrize("command", ["", *COMMANDS])
def test_every_option_and_subcommand_is_named(reference, helps, command):
    text = helps[command]
    options = set(re.findall(r"(?<![\w-])--[a-z][a-z0-9-]*", text)) - {"--help"}
    assert options or command == "", text
    missing = sorted(o for o in options if not re.search(re.escape(o) + r"(?![\w-])", reference))
    assert not missing, f"queueserver {command} --help has options {CONFIGURATION.name} never names: {missing}"
    if command == "":
        for sub in COMMANDS:
            uses = re.findall(rf"\bqueueserver {sub}\b", reference)
            assert len(uses) >= 2, f"`queueserver {sub}`: in the usage lines and described"
    if command == "cluster":
        actions = re.search(r"\{([a-z,-]+)\}", text).group(1).split(",")
        for action in actions:
            assert f"cluster {action}" in reference or f"|{action}" in reference, action


def test_cluster_status_help_describes_the_replica_view(helps):
    """``queueserver cluster status --help`` says what status shows of replicas, not only slots."""
    text = squeeze(helps["cluster"])
    for words in ("followers (in-sync or catching up", "events behind", "primary and epoch",
                  "fewer are in sync", "slot map agrees"):
        assert words in text, f"cluster --help does not say {words!r}:\n{helps['cluster']}"


def test_every_configuration_key_is_in_the_table(reference):
    table = "\n".join(line for line in reference.splitlines() if line.startswith("| `"))
    keys = [*SERVER]
    keys += [f"history.{key}" for key in HISTORY]
    keys += [f"<protocol>.{key}" for key in [*LISTENER, *TLS_LISTENER]]
    keys += [f"tls.{key}" for key in TLS]
    keys += [f"metrics.{key}" for key in [*LISTENER, *METRICS]]
    keys += [f"{protocol}.{key}" for protocol, options in CODEC_OPTIONS.items() for key in options]
    missing = [key for key in keys if f"| `{key}` |" not in table]
    assert not missing, f"configuration keys missing from {CONFIGURATION.name}'s key table: {missing}"
    for section in ("server", *DEFAULT_PORTS, "metrics", "history", "tls"):
        assert f"[{section}]" in reference, section


def test_the_full_configuration_example_is_accepted(reference):
    blocks = [b for b in re.findall(r"```toml\n(.*?)```", reference, re.S) if b.startswith("[server]")]
    assert len(blocks) == 1, "one ```toml block of every section, starting with [server]"
    data = tomllib.loads(blocks[0])
    assert {"server", "metrics", "history"} <= set(data), sorted(data)
    Config().update(data)   # raises ConfigError on any key the server refuses


def test_make_run_is_described_as_it_runs(readme):
    makefile = (ROOT / "Makefile").read_text()
    recipe = re.search(r"^run:.*\n\t\$\(BIN\)/(queueserver serve [^$\n]*)", makefile, re.M).group(1).strip()
    assert f"`{recipe}`" in readme, f"the README should say that make run starts `{recipe}`"
    assert re.search(r"re-shards? (it|the directory)", readme), "a start with another --shards re-shards"


@pytest.mark.parametrize("path", TEXTS, ids=lambda path: path.name)
@pytest.mark.parametrize("pattern", sorted(UNTRUE))
def test_no_untrue_statement(path, pattern):
    text = path.read_text(encoding="utf-8")
    found = re.search(pattern, text, re.I)
    assert found is None, (f"{path.name} line {text[:found.start()].count(chr(10)) + 1}: "
                           f"{found.group(0)!r}: {UNTRUE[pattern]}")


def test_the_reference_is_there():
    """The pages the checks above read exist (a missing page would check nothing)."""
    assert CONFIGURATION.is_file(), CONFIGURATION
    assert len(TEXTS) >= 10, [path.name for path in TEXTS]


def test_prerequisites_and_installing_are_stated(readme):
    start = readme.index("# queueserver\n")
    assert "## Prerequisites" in readme
    prerequisites = readme[readme.index("## Prerequisites"):]
    prerequisites = prerequisites[:prerequisites.index("\n## ", 4)]
    assert readme.index("## Prerequisites") < readme.index("## A five-minute tour"), "right after the intro"
    assert start < readme.index("## Prerequisites")
    for needed in ("Python 3.11", "python3-venv", "Java 17", "openjdk-17-jre-headless", "PYTHON=",
                   "pip install -e .", "pip install -e '.[spark]'", ".venv/bin/python",
                   ". .venv/bin/activate"):
        assert needed in prerequisites, f"the prerequisites do not say {needed!r}"
    assert re.search(r"\b\d+(\.\d+)? GB\b", prerequisites), "the disk the dev extras take"
    assert re.search(r"nothing is published on PyPI", prerequisites, re.I)
