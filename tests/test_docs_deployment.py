"""docs/deployment.md says what the files and the server do.

- The compose section's table of published ports is docker-compose.yml's,
  node by node and protocol by protocol.
- Every log line its Troubleshooting section quotes (and the start-up lines
  docs/getting-started.md quotes) is one the server can write: it fully matches a message of the source (a string literal, with
  adjacent literals joined, its ``{...}`` and ``%s``-style fields as
  wildcards), after the logger's name and level (or the command's
  ``queueserver serve: error:``) in front of it.
"""
from __future__ import annotations

import io
import re
import tokenize
from pathlib import Path
from typing import Dict, List

import yaml

from queueserver.config import DEFAULT_METRICS_PORT
from queueserver.protocols import DEFAULT_PORTS

ROOT = Path(__file__).resolve().parents[1]
PAGE = ROOT / "docs" / "deployment.md"
COMPOSE = ROOT / "deploy" / "compose" / "docker-compose.yml"
COLUMNS = {"workq": "workq", "takeanumber": "takeanumber", "goqueue": "goqueue", "queued": "queued",
           "TaskFlux": "taskflux", "metrics and console": "metrics"}
PREFIX = re.compile(r"^(?:queueserver \w+: error: |[\w-]+ (?:DEBUG|INFO|WARNING|ERROR) )")
FIELD = "\x00"


def section(title: str, page: Path = PAGE) -> str:
    text = page.read_text(encoding="utf-8")
    start = text.index(f"\n## {title}\n")
    end = text.find("\n## ", start + 1)
    return text[start:end if end > 0 else len(text)]


def test_the_compose_ports_table_is_the_compose_files():
    rows = [line.strip("|").split("|") for line in section("A three-node cluster with Docker Compose")
            .splitlines() if line.startswith("| ")]
    head = [cell.strip() for cell in rows[0]]
    documented = {row[0].strip(): {COLUMNS[h]: int(cell) for h, cell in zip(head[1:], row[1:])}
                  for row in rows[1:]}
    services = yaml.safe_load(COMPOSE.read_text())["services"]
    container = {**DEFAULT_PORTS, "metrics": DEFAULT_METRICS_PORT}
    published: Dict[str, Dict[str, int]] = {}
    for name, service in services.items():
        if not name.startswith("node-"):
            continue
        ports = {int(p.split(":")[2]): int(p.split(":")[1]) for p in service["ports"]}
        published[name[len("node-"):]] = {what: ports[port] for what, port in container.items()}
    assert documented == published


def _literal(token: tokenize.TokenInfo) -> str:
    """A string token's text, its fields (``{...}`` of an f-string, ``%s`` and the like) as FIELD."""
    text = token.string
    prefix = re.match(r"[A-Za-z]*", text).group(0).lower()
    body = text[len(prefix):]
    quote = body[:3] if body[:3] in ('"""', "'''") else body[0]
    body = body[len(quote):-len(quote)]
    if "f" in prefix:
        body = re.sub(r"\{\{|\}\}|\{[^{}]*(\{[^{}]*\}[^{}]*)*\}",
                      lambda m: {"{{": "{", "}}": "}"}.get(m.group(0), FIELD), body)
    if "r" not in prefix:
        body = body.encode("latin-1", "backslashreplace").decode("unicode_escape", "replace")
    return re.sub(r"%[-#0 +]?\d*(?:\.\d+)?[sdfrx]", FIELD, body)


FSTRING_START = getattr(tokenize, "FSTRING_START", None)     # Python 3.12 splits f-strings
FSTRING_MIDDLE = getattr(tokenize, "FSTRING_MIDDLE", None)
FSTRING_END = getattr(tokenize, "FSTRING_END", None)


def _strings(tokens) -> List[str]:   # type: ignore[no-untyped-def]
    """Each run of adjacent string literals of a token stream, joined."""
    found: List[str] = []
    joined: List[str] = []
    depth = 0                        # inside an f-string (3.12): its parts, fields as FIELD
    for token in tokens:
        if FSTRING_START is not None and token.type == FSTRING_START:
            depth += 1
            if depth == 1:
                joined.append("")
        elif depth:
            if token.type == FSTRING_END:
                depth -= 1
            elif token.type == FSTRING_MIDDLE and depth == 1:
                joined[-1] += token.string.replace("{{", "{").replace("}}", "}")
            elif token.type == tokenize.OP and token.string == "{" and depth == 1:
                joined[-1] += FIELD
        elif token.type == tokenize.STRING:
            joined.append(_literal(token))
        elif token.type in (tokenize.NL, tokenize.NEWLINE, tokenize.COMMENT) and joined:
            continue
        elif joined:
            found.append("".join(joined))
            joined = []
    return found


def messages() -> List[re.Pattern]:
    """Every string of the source (adjacent literals joined) as a pattern of what it writes."""
    found = []
    for path in (ROOT / "queueserver").rglob("*.py"):
        tokens = tokenize.generate_tokens(io.StringIO(path.read_text(encoding="utf-8")).readline)
        for text in _strings(tokens):
            if len(text.replace(FIELD, "")) >= 10:
                found.append(re.compile(".*?".join(re.escape(p) for p in text.split(FIELD)), re.S))
    return found


def plain_blocks(text: str) -> List[str]:
    """The bodies of ``text``'s fenced blocks without a language (fences paired in order)."""
    blocks, body, info = [], [], None
    for line in text.splitlines():
        fence = re.match(r"^ *```(\w*)\s*$", line)
        if fence and info is None:
            info, body = fence.group(1), []
        elif fence:
            if info == "":
                blocks.append("\n".join(body))
            info = None
        elif info is not None:
            body.append(line)
    return blocks


def quoted_lines(text: str) -> List[str]:
    """The lines of ``text``'s plain code blocks, without their time and logger."""
    lines = []
    for block in plain_blocks(text):
        for line in block.strip("\n").splitlines():
            line = re.sub(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} ", "", line.strip())
            lines.append(PREFIX.sub("", line))
    return lines


def test_every_quoted_log_line_is_one_the_server_writes():
    lines = quoted_lines(section("Troubleshooting"))
    assert len(lines) >= 6, lines
    started = quoted_lines(section("Start a server", ROOT / "docs" / "getting-started.md"))
    assert len(started) >= 8, started
    lines += started
    patterns = messages()
    unknown = [line for line in lines if not any(p.fullmatch(line) for p in patterns)]
    assert not unknown, f"lines no message of queueserver/ writes: {unknown}"


def test_a_made_up_line_is_found_out():
    patterns = messages()
    assert any(p.fullmatch("shard-3 exited with status 1; restarting") for p in patterns)
    assert not any(p.fullmatch("shard-3 exploded; restarting at once") for p in patterns)
