"""The table of operations (queueserver.engine.ops) against what really makes
and serves them: every codec's requests, the engine's handlers, and what
each request does when the engine runs it.

Which operations a codec can make is read from the codec's own source
(every ``Command(...)`` it builds, whatever its op comes from, and ``add``
where it calls ``new_job``), and real byte strings of each protocol are
decoded to show that each of those is made, and how. Each decoded request
then runs on an engine holding one ready job, and what it did (events,
a job made, a job history entry, a job handed over, its payload in the
answer, the bytes a connection budgets for it) must be what its entry
says. :func:`problems` says what disagrees; the tests below show that it
finds an operation missing anywhere, and a change of state not declared.
"""
from __future__ import annotations

import ast
import base64
import copy
import pathlib
import re
import struct
import uuid
from typing import Any, Dict, List, NamedTuple, Optional, Set

import pytest

import queueserver
from queueserver.engine import Engine, ops
from queueserver.engine.engine import EVENTS, REQUESTS
from queueserver.engine.requests import AddRequest, with_id
from queueserver.engine.status import OK
from queueserver.engine.views import undo_delivery
from queueserver.net.connection import QUEUE_ENTRY, SMALL_REPLY, reply_budget
from queueserver.protocols import PROTOCOLS, codec_class
from queueserver.protocols.base import ALL, LOCAL, Command
from queueserver.router.router import _MERGERS

T0 = 1_700_000_000_000_000
MAX_PAYLOAD = 1048576
QUEUE = "default"                  # queued's queue before any USE: every sample names it
JOB = "6a0b2a9e-5f1c-4d2e-9b7a-3c4d5e6f7a8b"     # the ready job each sample finds
NEW = "0f1e2d3c-4b5a-4968-8776-a5b4c3d2e1f0"     # a job a sample makes
PAYLOAD = b"PAYLOAD-of-the-ready-job"
BODY = b"a new job"
RESULT = b"RESULT"


def _tf(body: bytes) -> bytes:
    """A TaskFlux request packet."""
    return b"D" + struct.pack(">i", len(body)) + body


def _tf_string(value: bytes) -> bytes:
    return struct.pack(">i", len(value)) + value


#: Real requests of each protocol: every command each can make an operation of.
SAMPLES: Dict[str, List[bytes]] = {
    "workq": [
        f"add {NEW} {QUEUE} 1000 60000 {len(BODY)}\r\n".encode() + BODY + b"\r\n",
        f"schedule {NEW} {QUEUE} 1000 60000 2030-01-01T00:00:00Z {len(BODY)}\r\n".encode() + BODY + b"\r\n",
        f"run {NEW} {QUEUE} 1000 0 {len(BODY)}\r\n".encode() + BODY + b"\r\n",
        f"result {JOB} 0\r\n".encode(),
        f"lease {QUEUE} 0\r\n".encode(),
        f"complete {JOB} {len(RESULT)}\r\n".encode() + RESULT + b"\r\n",
        f"fail {JOB} {len(RESULT)}\r\n".encode() + RESULT + b"\r\n",
        f"delete {JOB}\r\n".encode(),
        b"inspect server\r\n",
        b"inspect queues 0 10\r\n",
        f"inspect queue {QUEUE}\r\n".encode(),
        f"inspect jobs {QUEUE} 0 10\r\n".encode(),
        f"inspect scheduled-jobs {QUEUE} 0 10\r\n".encode(),
        f"inspect job {JOB}\r\n".encode(),
    ],
    "takeanumber": [
        f"ADD {QUEUE} 0 ".encode() + BODY + b"\r\n",
        f"LEN {QUEUE}\r\n".encode(),
        f"RESERVE {QUEUE}\r\n".encode(),
        f"RETRY {QUEUE} {JOB}\r\n".encode(),
        f"DONE {QUEUE} {JOB}\r\n".encode(),
    ],
    "goqueue": [
        b"ADD\0" + QUEUE.encode() + b"\0" + struct.pack("<III", 0, 10, len(BODY)) + BODY,
        b"DELETE\0" + struct.pack("<Q", 1),
        b"RESERVE\0" + QUEUE.encode() + b"\0" + struct.pack("<I", 0),
    ],
    "queued": [
        b"ENQUE " + base64.b64encode(BODY) + b"\n",
        b"HAS " + base64.b64encode(b"h" * 32) + b"\n",
        b"DEQUE\n",
        b"SIZE\n",
        b"USE another\n",
    ],
    "taskflux": [
        _tf(b"E" + _tf_string(QUEUE.encode()) + struct.pack(">q", 5) + _tf_string(BODY)),
        _tf(b"D" + _tf_string(QUEUE.encode())),
        _tf(b"C" + _tf_string(QUEUE.encode())),
    ],
}


# ----------------------------------------------------- what codecs can make
#: the package's sources (read as text: the modules may be compiled)
PACKAGE = pathlib.Path(queueserver.__file__).parent


def _constants(node: ast.AST) -> Set[str]:
    return {n.value for n in ast.walk(node) if isinstance(n, ast.Constant) and isinstance(n.value, str)}


def codec_ops(protocol: str) -> Set[str]:
    """Every operation the codec's source can put in a :class:`Command`:
    a literal op; an op held in a name, with every string assigned to that
    name or passed for a parameter of that name; ``add`` for ``new_job``."""
    source = PACKAGE.parent / (PROTOCOLS[protocol][0].replace(".", "/") + ".py")   # (compiled or not)
    tree = ast.parse(source.read_text())
    made: Set[str] = set()

    def values_of(name: str) -> Set[str]:
        found: Set[str] = set()
        params = set()
        for node in ast.walk(tree):
            if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == name
                                                    for t in node.targets):
                found |= _constants(node.value)
            if isinstance(node, ast.FunctionDef) and name in [a.arg for a in node.args.args]:
                params.add((node.name, [a.arg for a in node.args.args].index(name)))
        for node in ast.walk(tree):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
                for function, at in params:
                    if node.func.id == function and len(node.args) > at:
                        found |= _constants(node.args[at])
        assert found, f"{protocol}: cannot tell what {name!r} holds"
        return found

    for node in ast.walk(tree):
        if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Name):
            continue
        if node.func.id == "new_job":
            made.add("add")
        elif node.func.id == "Command" and node.args:
            op = node.args[0]
            if isinstance(op, ast.Constant) and isinstance(op.value, str):
                made.add(op.value)
            elif isinstance(op, ast.Name):
                made |= values_of(op.id)
            elif not (isinstance(op, ast.Constant) and op.value is None):
                raise AssertionError(f"{protocol}: a Command whose op this test cannot read: "
                                     f"{ast.unparse(op)}")
    return made


_OP_NAME = re.compile(r"[a-z][a-z_]*\Z")


def _trees(under: pathlib.Path) -> Dict[str, ast.Module]:
    return {str(path.relative_to(PACKAGE.parent)): ast.parse(path.read_text())
            for path in sorted(under.rglob("*.py"))}


def server_sent_ops() -> Dict[str, Set[str]]:
    """Operations the server's own code sends (op -> the files): a string
    passed where a function, method or class of the package takes a
    parameter named ``op`` (``link.call("locate", ...)``,
    ``peers.ask(shard, "homed", ...)``, ``execute("cancel", ...)``)."""
    trees = _trees(PACKAGE)
    positions: Dict[str, Set[int]] = {}
    for tree in trees.values():
        for node in ast.walk(tree):
            if isinstance(node, ast.ClassDef):
                for item in node.body:
                    if isinstance(item, ast.FunctionDef) and item.name == "__init__":
                        names = [a.arg for a in item.args.args][1:]
                        if "op" in names:
                            positions.setdefault(node.name, set()).add(names.index("op"))
            elif isinstance(node, ast.FunctionDef) and node.name != "__init__":
                names = [a.arg for a in node.args.args]
                names = names[1:] if names[:1] in (["self"], ["cls"]) else names
                if "op" in names:
                    positions.setdefault(node.name, set()).add(names.index("op"))
    sent: Dict[str, Set[str]] = {}
    for path, tree in trees.items():
        for node in ast.walk(tree):
            if not isinstance(node, ast.Call):
                continue
            func = node.func
            name = (func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute)
                    else "")
            for at in positions.get(name, ()):
                arg = node.args[at] if len(node.args) > at else None
                if isinstance(arg, ast.Constant) and isinstance(arg.value, str) and _OP_NAME.match(arg.value):
                    sent.setdefault(arg.value, set()).add(path)
    return sent


def shell_handlers() -> Dict[str, int]:
    """The requests the shard's shell has a handler for, beside the engine:
    op -> ``ops.ID_HOME`` (the id homes' table) or ``ops.CLUSTER`` (the
    cluster operations')."""
    from queueserver.shard import clusterops, homes
    handlers = {name: ops.ID_HOME for name in homes.REQUESTS}
    handlers.update({name: ops.CLUSTER for name in clusterops.REQUESTS})
    return handlers


def decoded(protocol: str, data: bytes) -> Command:
    codec = codec_class(protocol)()
    commands = codec.receive(data)
    assert len(commands) == 1, (protocol, data, commands)
    command = commands[0]
    assert command.route != LOCAL, (protocol, data, command.reply)
    return command


# ------------------------------------------------------ what requests do
def _engine() -> Engine:
    """An engine holding one ready job, :data:`JOB` (number 1), in :data:`QUEUE`."""
    engine = Engine()
    engine.execute("add", AddRequest(JOB, QUEUE, PAYLOAD, 0, 60000, 0, 0, 0, None, False), T0)
    engine.history = True
    return engine


class Seen(NamedTuple):
    """What one decoded request did on :func:`_engine`."""

    protocol: str
    op: str
    args: Any
    route: int
    budget: int            # what the connection budgets for it
    changed: bool          # events were recorded
    placed: bool           # a job was made
    history: bool          # an entry of a job's history was made
    handed: Optional[str]  # a job handed over: "kept" (leased), "gone" (taken); None: not
    payload: bool          # the ready job's payload is in the answer


def run(protocol: str, data: bytes) -> Seen:
    command = decoded(protocol, data)
    op, args = command.op, command.args
    assert op is not None
    if command.new_id == "":   # the server makes the id (as a router or a shard would)
        args = with_id(args, NEW)
    engine = _engine()
    fx = engine.execute(op, args, T0 + 1000, ("token", 1))
    reply = fx.reply
    job = engine.jobs.get(JOB)
    handed = None
    if reply is not None and reply[0] == OK and type(reply[1]).__name__ == "LeaseView" \
            and reply[1].id == JOB:
        handed = "gone" if job is None else "kept"
    return Seen(protocol, op, args, command.route, reply_budget(command, MAX_PAYLOAD), bool(fx.events),
                bool(fx.placed), bool(fx.history), handed, PAYLOAD in repr(reply).encode())


SEEN: List[Seen] = [run(protocol, data) for protocol, samples in SAMPLES.items() for data in samples]
MADE: Dict[str, Set[str]] = {protocol: codec_ops(protocol) for protocol in PROTOCOLS}
SENT: Dict[str, Set[str]] = server_sent_ops()
SHELL: Dict[str, int] = shell_handlers()


def expected_budget(entry: ops.Op, args: Any) -> Optional[int]:
    """What the entry says a connection budgets for a request of ``args``
    (None: the entry's listing has no limit as its last argument)."""
    budget = SMALL_REPLY
    if entry.carries >= 0:
        budget += len(args[entry.carries])
    if entry.answer == ops.PAYLOAD:
        budget += MAX_PAYLOAD
    elif entry.answer in (ops.LISTING, ops.QUEUE_LISTING):
        if not args or type(args[-1]) is not int:
            return None
        budget += args[-1] * (MAX_PAYLOAD + SMALL_REPLY if entry.answer == ops.LISTING else QUEUE_ENTRY)
    return budget


# --------------------------------------------------------------- the check
def problems(table: Dict[str, ops.Op], event_kinds: Dict[str, ops.EventKind],
             requests: Dict[str, Any], events: Dict[str, Any],
             made: Dict[str, Set[str]], seen: List[Seen], sent: Dict[str, Set[str]],
             shell: Dict[str, int]) -> List[str]:
    """Everything on which the table, the engine, the codecs and what the
    requests did disagree (empty: they agree)."""
    out: List[str] = []
    engine_ops = {name for name, entry in table.items() if entry.flags & ops.ENGINE}
    for name in sorted(set(requests) - engine_ops):
        out.append(f"{name}: the engine serves it; the table has no engine entry for it")
    for name in sorted(engine_ops - set(requests)):
        out.append(f"{name}: the table says the engine serves it; the engine has no handler")
    for kind in sorted(set(events) ^ set(event_kinds)):
        out.append(f"event {kind}: " + ("no entry in the table" if kind in events else "no engine handler"))
    client_ops = {name for name, entry in table.items() if entry.flags & ops.FROM_CLIENT}
    by_codecs = set().union(*made.values())
    for protocol, names in sorted(made.items()):
        for name in sorted(names - client_ops):
            out.append(f"{name}: {protocol} makes it; the table has no client's operation of that name")
    for name in sorted(client_ops - by_codecs):
        out.append(f"{name}: the table says clients send it; no codec makes it")
    for protocol in made:
        decoded_ops = {s.op for s in seen if s.protocol == protocol}
        if decoded_ops != made[protocol]:
            out.append(f"{protocol}: its samples make {sorted(decoded_ops)}, its source "
                       f"{sorted(made[protocol])}")
    for name, files in sorted(sent.items()):
        if name not in table:
            out.append(f"{name}: {', '.join(sorted(files))} send(s) it; the table has no entry")
    undoes = {entry.undo for entry in table.values()}
    for name, entry in sorted(table.items()):
        if not entry.flags & (ops.FROM_CLIENT | ops.ENGINE) and name not in sent and name not in undoes:
            out.append(f"{name}: neither a client's nor the engine's, and nothing sends it")
        for flag, part in ((ops.ID_HOME, "id home"), (ops.CLUSTER, "cluster shell")):
            if entry.flags & flag and shell.get(name) != flag:
                out.append(f"{name}: the table has the shard's {part} serve it; it has no handler for it")
            if shell.get(name) == flag and not entry.flags & flag:
                out.append(f"{name}: the shard's {part} serves it; the table does not say so")
        if (entry.delivery != ops.NO_DELIVERY) != (entry.undo is not None):
            out.append(f"{name}: a delivery needs the request that gives its job back, and only one")
        if entry.flags & ops.FROM_CLIENT and entry.verb not in ops.ALL_VERBS:
            out.append(f"{name}: a client's operation needs a verb the access rules check "
                       f"(one of {', '.join(ops.ALL_VERBS)}); it has {entry.verb!r}")
        if not entry.flags & ops.FROM_CLIENT and entry.verb:
            out.append(f"{name}: the server's own operation has a verb ({entry.verb}): no client sends it")
        if entry.undo is not None and entry.undo not in requests:
            out.append(f"{name}: its give-back {entry.undo} has no engine handler")
    for s in seen:
        entry = table.get(s.op)
        if entry is None:
            continue   # reported above
        flags = entry.flags
        if s.changed != bool(flags & ops.CHANGES):
            out.append(f"{s.op} ({s.protocol}): it {'changed' if s.changed else 'did not change'} state; "
                       f"the table says {'it may' if flags & ops.CHANGES else 'it does not'}")
        if s.placed != bool(flags & ops.NUMBERED):
            out.append(f"{s.op} ({s.protocol}): it {'made' if s.placed else 'made no'} job; "
                       f"NUMBERED is {'set' if flags & ops.NUMBERED else 'not set'}")
        if s.history != bool(flags & ops.NAMES_CLIENT):
            out.append(f"{s.op} ({s.protocol}): it {'made' if s.history else 'made no'} job history entry; "
                       f"NAMES_CLIENT is {'set' if flags & ops.NAMES_CLIENT else 'not set'}")
        delivery = {None: ops.NO_DELIVERY, "kept": ops.ACKNOWLEDGED, "gone": ops.WRITTEN}[s.handed]
        if delivery != entry.delivery:
            out.append(f"{s.op} ({s.protocol}): its answer handed a job over ({s.handed}); "
                       f"the table's delivery is {entry.delivery}")
        if s.payload and entry.answer not in (ops.PAYLOAD, ops.LISTING):
            out.append(f"{s.op} ({s.protocol}): its answer carried a payload; the table says "
                       f"answer {entry.answer}")
        carried = [i for i, arg in enumerate(s.args) if arg in (BODY, RESULT)]
        if carried != ([entry.carries] if entry.carries >= 0 else []):
            out.append(f"{s.op} ({s.protocol}): it brings in argument(s) {carried}; the table says "
                       f"{entry.carries}")
        elif s.budget != expected_budget(entry, s.args):
            out.append(f"{s.op} ({s.protocol}): the connection budgets {s.budget} bytes; the table "
                       f"says {expected_budget(entry, s.args)}")
        if s.route == ALL and s.op not in _MERGERS:
            out.append(f"{s.op} ({s.protocol}): asked of every shard; the router has no merger for it")
    return out


def _problems(**changed: Any) -> List[str]:
    parts: Dict[str, Any] = dict(table=ops.OPS, event_kinds=ops.EVENT_KINDS, requests=REQUESTS,
                                 events=EVENTS, made=MADE, seen=SEEN, sent=SENT,
                                 shell=SHELL)
    parts.update(changed)
    return problems(**parts)


# ------------------------------------------------------------------ tests
def test_the_table_the_engine_and_the_codecs_agree():
    assert _problems() == []


def test_every_protocol_has_samples_of_what_it_makes():
    assert set(SAMPLES) == set(PROTOCOLS)
    assert all(MADE.values())


@pytest.mark.parametrize("name", sorted(ops.OPS))
def test_an_operation_missing_from_the_table_is_found(name):
    table = {k: v for k, v in ops.OPS.items() if k != name}
    found = _problems(table=table)
    assert any(p.startswith(f"{name}:") or f"{name} (" in p for p in found), found


@pytest.mark.parametrize("name", sorted(SHELL))
def test_an_operation_missing_from_the_shards_shell_is_found(name):
    """An id home's or a cluster's operation with no handler in the shard
    (its frames would go to the engine, which knows nothing of them), or a
    handler the table does not route to."""
    found = _problems(shell={k: v for k, v in SHELL.items() if k != name})
    assert any(p.startswith(f"{name}: the table has the shard's") for p in found), found
    entry = ops.OPS[name]
    table = dict(ops.OPS)
    table[name] = entry._replace(flags=entry.flags & ~(ops.ID_HOME | ops.CLUSTER))
    assert any(p.startswith(f"{name}: the shard's") for p in _problems(table=table))


@pytest.mark.parametrize("name", sorted(REQUESTS))
def test_an_operation_missing_from_the_engine_is_found(name):
    found = _problems(requests={k: v for k, v in REQUESTS.items() if k != name})
    assert any(p.startswith(f"{name}:") or f"give-back {name} " in p for p in found), found


@pytest.mark.parametrize("kind", sorted(EVENTS))
def test_an_event_missing_from_the_table_or_the_engine_is_found(kind):
    assert f"event {kind}: no entry in the table" in _problems(
        event_kinds={k: v for k, v in ops.EVENT_KINDS.items() if k != kind})
    assert f"event {kind}: no engine handler" in _problems(
        events={k: v for k, v in EVENTS.items() if k != kind})


@pytest.mark.parametrize("name", sorted(n for n, e in ops.OPS.items() if e.flags & ops.FROM_CLIENT))
def test_an_operation_no_codec_makes_is_found(name):
    made = {protocol: names - {name} for protocol, names in MADE.items()}
    assert f"{name}: the table says clients send it; no codec makes it" in _problems(made=made)


@pytest.mark.parametrize("name", sorted(n for n, e in ops.OPS.items() if e.flags & ops.FROM_CLIENT))
def test_a_clients_operation_without_a_verb_is_found(name):
    """Every client's operation declares what the access rules check."""
    table = dict(ops.OPS)
    table[name] = ops.OPS[name]._replace(verb="")
    assert any(p.startswith(f"{name}: a client's operation needs a verb") for p in _problems(table=table))
    assert ops.VERBS[name] in ops.ALL_VERBS


def test_a_servers_operation_with_a_verb_is_found():
    table = dict(ops.OPS)
    table["unlease"] = ops.OPS["unlease"]._replace(verb=ops.CONSUME)
    assert "unlease: the server's own operation has a verb (consume): no client sends it" in \
        _problems(table=table)


def test_a_codec_making_an_operation_the_table_lacks_is_found():
    made = copy.deepcopy(MADE)
    made["workq"].add("peek")
    assert "peek: workq makes it; the table has no client's operation of that name" in _problems(made=made)


@pytest.mark.parametrize("name", sorted(n for n, e in ops.OPS.items() if e.flags & ops.FROM_CLIENT
                                        and e.flags & (ops.CHANGES | ops.NUMBERED | ops.NAMES_CLIENT)))
def test_a_change_of_state_not_declared_is_found(name):
    """Forget CHANGES (or NUMBERED, NAMES_CLIENT) and what the request does
    says so: a write accepted while the disk fails, a job unnumbered, a
    history with no one behind a step."""
    entry = ops.OPS[name]
    for flag in (ops.CHANGES, ops.NUMBERED, ops.NAMES_CLIENT):
        if entry.flags & flag:
            table = dict(ops.OPS)
            table[name] = entry._replace(flags=entry.flags & ~flag)
            assert any(p.startswith(f"{name} (") for p in _problems(table=table)), (name, flag)


@pytest.mark.parametrize("name", ["add", "run", "lease", "complete", "fail", "take", "inspect_jobs",
                                  "inspect_queues"])
def test_a_budget_or_answer_changed_in_the_table_is_found(name):
    entry = ops.OPS[name]
    table = dict(ops.OPS)
    table[name] = entry._replace(answer=(entry.answer + 1) % 4)
    assert any(p.startswith(f"{name} (") for p in _problems(table=table))


@pytest.mark.parametrize("protocol, data", [(s.protocol, d) for s, d in zip(
    SEEN, [d for samples in SAMPLES.values() for d in samples]) if s.handed is not None])
def test_a_job_handed_to_a_client_that_left_comes_back(protocol, data):
    """What the table names as a delivery's give-back puts the job back in line."""
    command = decoded(protocol, data)
    engine = _engine()
    reply = engine.execute(command.op, command.args, T0 + 1000, ("token", 1)).reply
    undo = undo_delivery(command.op, reply)
    assert undo is not None and undo[0] == ops.OPS[command.op].undo
    engine.execute(undo[0], undo[1], T0 + 2000)
    assert [job.id for job in engine.queues[QUEUE].ready] == [JOB]


def test_the_metrics_count_every_kind_of_counting_the_table_declares():
    """Each event kind's declared counting has its counter in the shard's
    statistics (a job's cycle is counted in ``observe`` itself)."""
    from queueserver.shard.stats import COUNTING
    assert set(ops.COUNTS.values()) == set(COUNTING) | {ops.LEASES, ops.COMPLETES, ops.ADDS}
