"""Unit tests for the sans-I/O workq codec: bytes in, Command objects out,
replies rendered to exact bytes. No sockets.

The rules checked are those of the codec's docstring
(:mod:`queueserver.protocols.workq`) and docs/protocols.md: every success
reply starts with '+', `inspect server`'s key count equals the keys sent,
any canonical UUID is accepted, the original server's error texts.
"""
from __future__ import annotations

import calendar
import time

import pytest

from codec_helpers import only_command

from queueserver.engine.status import CLIENT_ERROR, NOT_FOUND, OK, SERVER_ERROR, TIMEOUT
from queueserver.protocols.base import ALL, BY_ID, BY_NAME, BY_NAMES, LOCAL
from queueserver.protocols.workq import WorkqCodec

ID = "6ba7b810-9dad-11d1-80b4-00c04fd430c4"   # the protocol's example id (a version-1 UUID)
ID2 = "6ba7b810-9dad-11d1-80b4-00c04fd430c6"
ID7 = "6ba7b810-9dad-11d1-80b4-00c04fd430c7"
ID8 = "6ba7b810-9dad-11d1-80b4-00c04fd430c8"
ID9 = "6ba7b810-9dad-11d1-80b4-00c04fd430c9"
IDB = ID.encode()

MAX_PAYLOAD = 1048576
DELETE = b"delete " + IDB + b"\r\n"


# ------------------------------------------------------------------ helpers
def us(stamp: str) -> int:
    """``YYYY-MM-DDTHH:MM:SSZ`` -> microseconds since the epoch (UTC)."""
    return calendar.timegm(time.strptime(stamp, "%Y-%m-%dT%H:%M:%SZ")) * 1_000_000


def decode(data: bytes):
    return WorkqCodec().receive(data)


def one(data: bytes):
    return only_command(decode(data))


def norm(value):
    """Tuples and lists compare alike."""
    if isinstance(value, (list, tuple)):
        return [norm(v) for v in value]
    return value


def error_reply(data: bytes) -> bytes:
    """The reply of the first command decoded from ``data``, which must be LOCAL."""
    cmds = decode(data)
    assert cmds, "nothing decoded"
    assert cmds[0].route == LOCAL, cmds[0]
    return cmds[0].reply


def ce(message: str) -> bytes:
    return b"-CLIENT-ERROR " + message.encode() + b"\r\n"


def add_args(cmd):
    """The engine ``_add`` arguments (id, name, payload, priority, ttr, ttl,
    max_attempts, max_fails, sched); any further engine options (used by other
    protocols) must stay at their off defaults for workq."""
    assert cmd.op == "add"
    assert all(not extra for extra in cmd.args[9:]), cmd.args
    return norm(cmd.args[:9])


def assert_delete(cmd, id: str = ID) -> None:
    assert cmd.op == "delete"
    assert norm(cmd.args) == [id]
    assert cmd.route == BY_ID
    assert cmd.key == id


def job_view(id=ID, name="ping", ttr=1000, ttl=60000, payload=b"ping", max_attempts=0,
             attempts=0, max_fails=0, fails=0, priority=0, state=0,
             created="2016-08-22T01:50:51Z", sched=None):
    """An engine ``inspect_view``."""
    return [id, name, ttr, ttl, payload, max_attempts, attempts, max_fails, fails, priority,
            state, us(created), None if sched is None else us(sched)]


# ======================================================= seed example requests
def test_add_seed_example_with_all_flags():
    cmd = one(b"add " + IDB + b" ping 1000 60000 4 -priority=10 -max-attempts=3 -max-fails=1\r\n"
              b"pong\r\n")
    assert cmd.op == "add"
    # engine _add(id, name, payload, priority, ttr, ttl, max_attempts, max_fails, sched)
    assert add_args(cmd) == [ID, "ping", b"pong", 10, 1000, 60000, 3, 1, None]
    assert cmd.route == BY_NAME
    assert cmd.key == "ping"
    assert cmd.new_id == ID


def test_add_without_flags_uses_defaults():
    cmd = one(b"add " + IDB + b" ping 1000 60000 4\r\npong\r\n")
    assert add_args(cmd) == [ID, "ping", b"pong", 0, 1000, 60000, 0, 0, None]


def test_add_flags_in_any_order():
    cmd = one(b"add " + IDB + b" ping 1000 60000 4 -max-fails=2 -priority=-5 -max-attempts=255\r\n"
              b"pong\r\n")
    assert add_args(cmd) == [ID, "ping", b"pong", -5, 1000, 60000, 255, 2, None]


def test_schedule_seed_example_time_in_microseconds_utc():
    cmd = one(b"schedule " + ID7.encode() + b" ping 1000 2000 2016-06-14T06:46:46Z 4\r\npong\r\n")
    assert cmd.op == "add"
    assert add_args(cmd) == [ID7, "ping", b"pong", 0, 1000, 2000, 0, 0, 1465886806 * 1_000_000]
    assert cmd.route == BY_NAME
    assert cmd.key == "ping"
    assert cmd.new_id == ID7


def test_schedule_with_flags():
    cmd = one(b"schedule " + ID7.encode() + b" ping 1000 2000 2020-02-02T00:00:00Z 4"
              b" -priority=7 -max-attempts=2 -max-fails=1\r\npong\r\n")
    assert add_args(cmd) == [ID7, "ping", b"pong", 7, 1000, 2000, 2, 1,
                              us("2020-02-02T00:00:00Z")]


def test_run_seed_example():
    cmd = one(b"run " + IDB + b" ping 1000 60000 4\r\nping\r\n")
    assert cmd.op == "run"
    # engine _run(id, name, payload, priority, ttr, timeout)
    assert norm(cmd.args) == [ID, "ping", b"ping", 0, 1000, 60000]
    assert cmd.route == BY_NAME
    assert cmd.key == "ping"
    assert cmd.new_id == ID


def test_run_with_priority():
    cmd = one(b"run " + IDB + b" ping 1000 0 4 -priority=-2147483648\r\nping\r\n")
    assert norm(cmd.args) == [ID, "ping", b"ping", -2147483648, 1000, 0]


def test_result_seed_example():
    cmd = one(b"result " + IDB + b" 60000\r\n")
    assert cmd.op == "result"
    assert norm(cmd.args) == [ID, 60000]
    assert cmd.route == BY_ID
    assert cmd.key == ID


def test_lease_seed_example_several_names():
    cmd = one(b"lease ping1 ping2 ping3 60000\r\n")
    assert cmd.op == "lease"
    assert norm(cmd.args) == [["ping1", "ping2", "ping3"], 60000]
    assert cmd.route == BY_NAMES
    assert norm(cmd.key) == ["ping1", "ping2", "ping3"]


def test_lease_single_name_zero_timeout():
    cmd = one(b"lease ping 0\r\n")
    assert norm(cmd.args) == [["ping"], 0]
    assert cmd.route == BY_NAMES


@pytest.mark.parametrize("op, result", [("complete", b"pong"), ("fail", b"oops")])
def test_complete_seed_example_and_fail(op, result):
    cmd = one(op.encode() + b" " + IDB + b" 4\r\n" + result + b"\r\n")
    assert cmd.op == op
    assert norm(cmd.args) == [ID, result]
    assert cmd.route == BY_ID
    assert cmd.key == ID


def test_complete_and_fail_with_empty_result():
    assert norm(one(b"complete " + IDB + b" 0\r\n\r\n").args) == [ID, b""]
    assert norm(one(b"fail " + IDB + b" 0\r\n\r\n").args) == [ID, b""]


def test_delete():
    assert_delete(one(DELETE))


@pytest.mark.parametrize("line, op, args, route, key", [
    (b"inspect job " + IDB, "inspect_job", [ID], BY_ID, ID),
    (b"inspect jobs ping 0 10", "inspect_jobs", ["ping", 0, 10], BY_NAME, "ping"),
    (b"inspect scheduled-jobs ping 0 10", "inspect_scheduled", ["ping", 0, 10], BY_NAME, "ping"),
    (b"inspect queue ping", "inspect_queue", ["ping"], BY_NAME, "ping"),
    (b"inspect queues 0 10", "inspect_queues", [0, 10], ALL, None),
    (b"inspect server", "inspect_server", [], ALL, None),
], ids=["job", "jobs", "scheduled-jobs", "queue", "queues", "server"])
def test_inspect_seed_examples(line, op, args, route, key):
    cmd = one(line + b"\r\n")
    assert cmd.op == op
    assert norm(cmd.args) == args
    assert cmd.route == route
    assert cmd.key == key


def test_inspect_limits_at_bounds():
    assert norm(one(b"inspect queues 7 1\r\n").args) == [7, 1]
    assert norm(one(b"inspect jobs ping 0 100\r\n").args) == ["ping", 0, 100]


@pytest.mark.parametrize("id", [
    "6ba7b810-9dad-11d1-80b4-00c04fd430c4",   # version 1 (the protocol's own example)
    "0c1e3b1e-7c4c-4e5d-9a41-5b8d4f0f6a2e",   # version 4
    "017f22e2-79b0-7cc3-98c4-dc0c0c07398f",   # version 7
    "00000000-0000-0000-0000-000000000000",   # nil UUID
])
def test_any_canonical_uuid_accepted(id):
    cmd = one(b"delete " + id.encode() + b"\r\n")
    assert_delete(cmd, id)


def test_uppercase_uuid_accepted():
    cmd = one(b"delete " + ID.upper().encode() + b"\r\n")
    assert cmd.op == "delete"
    assert cmd.key.lower() == ID


def test_limits_accepted_at_their_maximum():
    cmd = one(b"add " + IDB + b" a.b_c-D9 86400000 18446744073709551615 4"
              b" -priority=2147483647 -max-attempts=255 -max-fails=255\r\npong\r\n")
    assert add_args(cmd) == [ID, "a.b_c-D9", b"pong", 2147483647, 86400000, 2 ** 64 - 1,
                              255, 255, None]
    assert norm(one(b"lease " + b"n" * 255 + b" 86400000\r\n").args) == [["n" * 255], 86400000]


def test_payload_of_exactly_max_size_accepted():
    payload = b"x" * MAX_PAYLOAD
    cmd = one(b"add " + IDB + b" ping 1000 60000 1048576\r\n" + payload + b"\r\n")
    assert cmd.op == "add"
    assert cmd.args[2] == payload


# ================================================================ rendering
def render_for(line: bytes):
    """The render function of the command decoded from ``line``."""
    cmd = one(line)
    assert cmd.render is not None
    return cmd.render


ADD = b"add " + IDB + b" ping 1000 60000 4\r\npong\r\n"
SCHEDULE = b"schedule " + IDB + b" ping 1000 60000 2016-06-14T06:46:46Z 4\r\npong\r\n"
RUN = b"run " + IDB + b" ping 1000 60000 4\r\nping\r\n"
RESULT = b"result " + IDB + b" 60000\r\n"
LEASE = b"lease ping1 ping2 60000\r\n"
COMPLETE = b"complete " + IDB + b" 4\r\npong\r\n"
FAIL = b"fail " + IDB + b" 4\r\npong\r\n"
INSPECT_JOB = b"inspect job " + IDB + b"\r\n"
INSPECT_JOBS = b"inspect jobs ping 0 10\r\n"
INSPECT_SCHED = b"inspect scheduled-jobs ping 0 10\r\n"
INSPECT_QUEUE = b"inspect queue ping\r\n"
INSPECT_QUEUES = b"inspect queues 0 10\r\n"
INSPECT_SERVER = b"inspect server\r\n"

ALL_REQUESTS = {
    "add": ADD, "schedule": SCHEDULE, "run": RUN, "result": RESULT, "lease": LEASE,
    "complete": COMPLETE, "fail": FAIL, "delete": DELETE, "inspect-job": INSPECT_JOB,
    "inspect-jobs": INSPECT_JOBS, "inspect-scheduled-jobs": INSPECT_SCHED,
    "inspect-queue": INSPECT_QUEUE, "inspect-queues": INSPECT_QUEUES,
    "inspect-server": INSPECT_SERVER,
}


@pytest.mark.parametrize("request_", [ADD, SCHEDULE, COMPLETE, FAIL, DELETE],
                         ids=["add", "schedule", "complete", "fail", "delete"])
@pytest.mark.parametrize("value", [None, 7, [ID, 7]], ids=["none", "number", "id-number"])
def test_ok_reply(request_, value):
    # The engine answers add with the job's id/number and the others with None;
    # the workq reply is a bare +OK either way (decisions: fail too gets '+').
    assert render_for(request_)([OK, value]) == b"+OK\r\n"


def test_lease_reply_seed_example():
    # engine lease_view: [id, name, payload, number, priority, ttr, attempts, order]
    view = [ID, "ping", b"ping", 1, 0, 1000, 1, (0, 0)]
    assert render_for(LEASE)([OK, view]) == (
        b"+OK 1\r\n"
        b"6ba7b810-9dad-11d1-80b4-00c04fd430c4 ping 4\r\n"
        b"ping\r\n")


def test_lease_reply_binary_and_empty_payload():
    payload = b"a\r\nb\x00\r\n"
    render = render_for(LEASE)
    assert render([OK, [ID, "q.1", payload, 5, 0, 1000, 1, None]]) == (
        b"+OK 1\r\n" + IDB + b" q.1 " + str(len(payload)).encode() + b"\r\n" + payload + b"\r\n")
    assert render([OK, [ID, "q", b"", 5, 0, 1000, 1, None]]) == (
        b"+OK 1\r\n" + IDB + b" q 0\r\n\r\n")


@pytest.mark.parametrize("request_", [RUN, RESULT], ids=["run", "result"])
def test_result_reply_seed_example(request_):
    assert render_for(request_)([OK, [ID, 1, b"pong"]]) == (
        b"+OK 1\r\n"
        b"6ba7b810-9dad-11d1-80b4-00c04fd430c4 1 4\r\n"
        b"pong\r\n")


@pytest.mark.parametrize("request_", [RUN, RESULT], ids=["run", "result"])
def test_result_reply_failed_empty_result(request_):
    assert render_for(request_)([OK, [ID, 0, b""]]) == b"+OK 1\r\n" + IDB + b" 0 0\r\n\r\n"


def test_inspect_job_reply_seed_example_12_keys():
    view = job_view(ttl=600000)
    view[11] += 999_999  # sub-second microseconds are truncated, not rounded
    assert render_for(INSPECT_JOB)([OK, view]) == (
        b"+OK 1\r\n"
        b"6ba7b810-9dad-11d1-80b4-00c04fd430c4 12\r\n"
        b"name ping\r\n"
        b"ttr 1000\r\n"
        b"ttl 600000\r\n"
        b"payload-size 4\r\n"
        b"payload ping\r\n"
        b"max-attempts 0\r\n"
        b"attempts 0\r\n"
        b"max-fails 0\r\n"
        b"fails 0\r\n"
        b"priority 0\r\n"
        b"state 0\r\n"
        b"created 2016-08-22T01:50:51Z\r\n")


def test_inspect_job_reply_scheduled_13_keys_and_values():
    view = job_view(id=ID9, name="q_1", ttr=5, ttl=2 ** 64 - 1, payload=b"xyz",
                    max_attempts=3, attempts=2, max_fails=1, fails=1, priority=-7, state=3,
                    created="2016-08-22T02:16:30Z", sched="2016-09-01T18:00:00Z")
    assert render_for(INSPECT_JOB)([OK, view]) == (
        b"+OK 1\r\n"
        b"6ba7b810-9dad-11d1-80b4-00c04fd430c9 13\r\n"
        b"name q_1\r\n"
        b"ttr 5\r\n"
        b"ttl 18446744073709551615\r\n"
        b"payload-size 3\r\n"
        b"payload xyz\r\n"
        b"max-attempts 3\r\n"
        b"attempts 2\r\n"
        b"max-fails 1\r\n"
        b"fails 1\r\n"
        b"priority -7\r\n"
        b"state 3\r\n"
        b"created 2016-08-22T02:16:30Z\r\n"
        b"time 2016-09-01T18:00:00Z\r\n")


def test_inspect_jobs_reply_seed_example_two_jobs():
    views = [job_view(ID, created="2016-08-22T01:50:51Z"),
             job_view(ID2, created="2016-08-22T02:00:17Z")]
    assert render_for(INSPECT_JOBS)([OK, views]) == (
        b"+OK 2\r\n"
        b"6ba7b810-9dad-11d1-80b4-00c04fd430c4 12\r\n"
        b"name ping\r\n"
        b"ttr 1000\r\n"
        b"ttl 60000\r\n"
        b"payload-size 4\r\n"
        b"payload ping\r\n"
        b"max-attempts 0\r\n"
        b"attempts 0\r\n"
        b"max-fails 0\r\n"
        b"fails 0\r\n"
        b"priority 0\r\n"
        b"state 0\r\n"
        b"created 2016-08-22T01:50:51Z\r\n"
        b"6ba7b810-9dad-11d1-80b4-00c04fd430c6 12\r\n"
        b"name ping\r\n"
        b"ttr 1000\r\n"
        b"ttl 60000\r\n"
        b"payload-size 4\r\n"
        b"payload ping\r\n"
        b"max-attempts 0\r\n"
        b"attempts 0\r\n"
        b"max-fails 0\r\n"
        b"fails 0\r\n"
        b"priority 0\r\n"
        b"state 0\r\n"
        b"created 2016-08-22T02:00:17Z\r\n")


def test_inspect_scheduled_jobs_reply_seed_example():
    views = [job_view(ID9, created="2016-08-22T02:16:30Z", sched="2016-09-01T18:00:00Z"),
             job_view(ID8, created="2016-08-22T02:16:58Z", sched="2016-09-01T19:00:00Z")]
    assert render_for(INSPECT_SCHED)([OK, views]) == (
        b"+OK 2\r\n"
        b"6ba7b810-9dad-11d1-80b4-00c04fd430c9 13\r\n"
        b"name ping\r\n"
        b"ttr 1000\r\n"
        b"ttl 60000\r\n"
        b"payload-size 4\r\n"
        b"payload ping\r\n"
        b"max-attempts 0\r\n"
        b"attempts 0\r\n"
        b"max-fails 0\r\n"
        b"fails 0\r\n"
        b"priority 0\r\n"
        b"state 0\r\n"
        b"created 2016-08-22T02:16:30Z\r\n"
        b"time 2016-09-01T18:00:00Z\r\n"
        b"6ba7b810-9dad-11d1-80b4-00c04fd430c8 13\r\n"
        b"name ping\r\n"
        b"ttr 1000\r\n"
        b"ttl 60000\r\n"
        b"payload-size 4\r\n"
        b"payload ping\r\n"
        b"max-attempts 0\r\n"
        b"attempts 0\r\n"
        b"max-fails 0\r\n"
        b"fails 0\r\n"
        b"priority 0\r\n"
        b"state 0\r\n"
        b"created 2016-08-22T02:16:58Z\r\n"
        b"time 2016-09-01T19:00:00Z\r\n")


@pytest.mark.parametrize("request_", [INSPECT_JOBS, INSPECT_SCHED], ids=["jobs", "scheduled"])
def test_inspect_jobs_reply_empty(request_):
    assert render_for(request_)([OK, []]) == b"+OK 0\r\n"


def test_inspect_job_binary_payload_key():
    payload = b"a\r\nb\x00"
    out = render_for(INSPECT_JOB)([OK, job_view(payload=payload)])
    assert b"\r\npayload-size 5\r\npayload " + payload + b"\r\nmax-attempts 0\r\n" in out


def test_inspect_queue_reply():
    # A key line's count is the number of key lines that follow it (two
    # here, as in `inspect queues`: "ping1 2").
    assert render_for(INSPECT_QUEUE)([OK, ["ping", 3, 0]]) == (
        b"+OK 1\r\n"
        b"ping 2\r\n"
        b"ready-len 3\r\n"
        b"scheduled-len 0\r\n")


def test_inspect_queues_reply_seed_example():
    assert render_for(INSPECT_QUEUES)([OK, [["ping1", 3, 0], ["ping2", 9, 0]]]) == (
        b"+OK 2\r\n"
        b"ping1 2\r\n"
        b"ready-len 3\r\n"
        b"scheduled-len 0\r\n"
        b"ping2 2\r\n"
        b"ready-len 9\r\n"
        b"scheduled-len 0\r\n")


def test_inspect_queues_reply_empty():
    assert render_for(INSPECT_QUEUES)([OK, []]) == b"+OK 0\r\n"


def test_inspect_server_reply_seed_example():
    info = {"active-clients": 32, "evicted-jobs": 0, "started": us("2016-01-02T15:04:05Z")}
    assert render_for(INSPECT_SERVER)([OK, info]) == (
        b"+OK 1\r\n"
        b"server 3\r\n"
        b"active-clients 32\r\n"
        b"evicted-jobs 0\r\n"
        b"started 2016-01-02T15:04:05Z\r\n")


def test_inspect_server_key_count_equals_keys_sent_with_extra_fields():
    # Shards also report jobs/queues/...; whatever the codec sends, the count
    # on the "server" line must equal the key lines that follow.
    info = {"active-clients": 1, "evicted-jobs": 2, "started": us("2016-01-02T15:04:05Z"),
            "jobs": 4, "queues": 5, "waiters": 6, "last-number": 7}
    out = render_for(INSPECT_SERVER)([OK, info])
    lines = out.split(b"\r\n")
    assert lines[0] == b"+OK 1"
    assert lines[-1] == b""
    head, count = lines[1].split(b" ")
    assert head == b"server"
    keys = lines[2:-1]
    assert int(count) == len(keys)
    assert keys[:3] == [b"active-clients 1", b"evicted-jobs 2", b"started 2016-01-02T15:04:05Z"]


ERROR_REPLIES = [
    ([CLIENT_ERROR, "Duplicate job"], b"-CLIENT-ERROR Duplicate job\r\n"),
    ([CLIENT_ERROR, "Job already leased"], b"-CLIENT-ERROR Job already leased\r\n"),
    ([SERVER_ERROR, "disk on fire"], b"-SERVER-ERROR disk on fire\r\n"),
    ([NOT_FOUND, ""], b"-NOT-FOUND\r\n"),
    ([TIMEOUT, ""], b"-TIMEOUT\r\n"),
]


@pytest.mark.parametrize("reply, expected", ERROR_REPLIES,
                         ids=["client", "client2", "server", "not-found", "timeout"])
@pytest.mark.parametrize("name", list(ALL_REQUESTS))
def test_error_replies_for_every_command(name, reply, expected):
    assert render_for(ALL_REQUESTS[name])(reply) == expected


# =============================================================== validation
BAD_ID = b"6ba7b810-9dad-11d1-80b4-00c04fd430c"       # one hex digit short
NAME_256 = b"n" * 256


def add(id=IDB, name=b"ping", ttr=b"1000", ttl=b"60000", size=b"4", flags=b"", block=b"pong"):
    line = b" ".join((b"add", id, name, ttr, ttl, size)) + flags + b"\r\n"
    return line + (block + b"\r\n" if block is not None else b"")


def schedule(time_=b"2016-06-14T06:46:46Z", flags=b"", ttr=b"1000", ttl=b"2000"):
    return (b"schedule " + IDB + b" ping " + ttr + b" " + ttl + b" " + time_ + b" 4" + flags +
            b"\r\npong\r\n")


def run(ttr=b"1000", timeout=b"60000", flags=b"", name=b"ping", id=IDB):
    return b"run " + id + b" " + name + b" " + ttr + b" " + timeout + b" 4" + flags + b"\r\nping\r\n"


# (input, expected error message, exact): `exact` marks inputs whose extent the
# codec can know (a valid line and, for block commands, a readable size: the
# right argument count and a number), so exactly one reply must come out of
# them. The others (a block command's size unreadable) leave the block to be
# read as a line of its own: the decisions file resumes parsing at the next line.
VALIDATION = {
    # --- Unknown command
    "unknown-command": (b"foo bar\r\n", "Unknown command", True),
    "empty-line": (b"\r\n", "Unknown command", True),
    "blank-line": (b"   \r\n", "Unknown command", True),
    "uppercase-command": (b"DELETE " + IDB + b"\r\n", "Unknown command", True),
    "inspect-unknown-object": (b"inspect foo\r\n", "Unknown command", True),
    # --- Invalid command args: wrong argument counts
    "add-too-few": (b"add " + IDB + b" ping 1000 4\r\npong\r\n", "Invalid command args", False),
    "add-too-many": (b"add " + IDB + b" ping 1000 60000 4 9\r\npong\r\n",
                     "Invalid command args", True),
    "schedule-too-few": (b"schedule " + IDB + b" ping 1000 2000 4\r\npong\r\n",
                         "Invalid command args", False),
    "run-too-few": (b"run " + IDB + b" ping 1000 4\r\nping\r\n", "Invalid command args", False),
    "run-too-many": (b"run " + IDB + b" ping 1000 60000 4 1\r\nping\r\n",
                     "Invalid command args", True),
    "result-too-few": (b"result " + IDB + b"\r\n", "Invalid command args", True),
    "result-too-many": (b"result " + IDB + b" 1 2\r\n", "Invalid command args", True),
    "lease-no-args": (b"lease\r\n", "Invalid command args", True),
    "lease-timeout-only": (b"lease 60000\r\n", "Invalid command args", True),
    "complete-too-few": (b"complete " + IDB + b"\r\n", "Invalid command args", True),
    "complete-too-many": (b"complete " + IDB + b" 4 4\r\npong\r\n", "Invalid command args", True),
    "fail-too-few": (b"fail " + IDB + b"\r\n", "Invalid command args", True),
    "delete-no-args": (b"delete\r\n", "Invalid command args", True),
    "delete-too-many": (b"delete " + IDB + b" " + IDB + b"\r\n", "Invalid command args", True),
    "inspect-no-args": (b"inspect\r\n", "Invalid command args", True),
    "inspect-job-no-id": (b"inspect job\r\n", "Invalid command args", True),
    "inspect-job-two-ids": (b"inspect job " + IDB + b" " + IDB + b"\r\n",
                            "Invalid command args", True),
    "inspect-jobs-too-few": (b"inspect jobs ping 0\r\n", "Invalid command args", True),
    "inspect-jobs-too-many": (b"inspect jobs ping 0 10 1\r\n", "Invalid command args", True),
    "inspect-scheduled-too-few": (b"inspect scheduled-jobs ping\r\n", "Invalid command args", True),
    "inspect-queue-no-name": (b"inspect queue\r\n", "Invalid command args", True),
    "inspect-queue-two-names": (b"inspect queue a b\r\n", "Invalid command args", True),
    "inspect-queues-too-few": (b"inspect queues 0\r\n", "Invalid command args", True),
    "inspect-queues-too-many": (b"inspect queues 0 10 1\r\n", "Invalid command args", True),
    "inspect-server-extra": (b"inspect server now\r\n", "Invalid command args", True),
    # --- Invalid command args: flags on commands that take none
    "delete-flag": (b"delete " + IDB + b" -priority=1\r\n", "Invalid command args", True),
    "result-flag": (b"result " + IDB + b" 100 -priority=1\r\n", "Invalid command args", True),
    "lease-flag": (b"lease ping 100 -priority=1\r\n", "Invalid command args", True),
    "complete-flag": (b"complete " + IDB + b" 4 -priority=1\r\npong\r\n",
                      "Invalid command args", True),
    "fail-flag": (b"fail " + IDB + b" 4 -x=1\r\npong\r\n", "Invalid command args", True),
    "inspect-job-flag": (b"inspect job " + IDB + b" -x=1\r\n", "Invalid command args", True),
    "inspect-server-flag": (b"inspect server -x=1\r\n", "Invalid command args", True),
    # --- Invalid command flags
    "flag-empty-value": (add(flags=b" -k="), "Invalid command flags", True),
    "flag-empty-value-known": (add(flags=b" -priority="), "Invalid command flags", True),
    "flag-empty-key": (add(flags=b" -=1"), "Invalid command flags", True),
    "flag-duplicate": (add(flags=b" -priority=1 -priority=2"), "Invalid command flags", True),
    "flag-duplicate-schedule": (schedule(flags=b" -max-fails=1 -max-fails=1"),
                                "Invalid command flags", True),
    "flag-unknown-add": (add(flags=b" -foo=1"), "Invalid command flags", True),
    "flag-empty-value-run": (run(flags=b" -priority="), "Invalid command flags", True),
    # --- Invalid payload size
    "payload-size-non-numeric": (add(size=b"abc"), "Invalid payload size", False),
    "payload-size-negative": (add(size=b"-1", block=None), "Invalid payload size", False),
    "payload-size-over-max": (add(size=b"1048577", block=None), "Invalid payload size", True),
    "payload-size-block-too-long": (add(size=b"3"), "Invalid payload size", True),
    "payload-no-crlf-after-block": (add(block=b"pongXY"), "Invalid payload size", True),
    "schedule-size-non-numeric": (b"schedule " + IDB + b" ping 1 1 2016-06-14T06:46:46Z x\r\n",
                                  "Invalid payload size", False),
    "run-size-over-max": (b"run " + IDB + b" ping 1000 10 1048577\r\n",
                          "Invalid payload size", True),
    # --- Invalid result size
    "complete-size-non-numeric": (b"complete " + IDB + b" abc\r\n", "Invalid result size", False),
    "complete-size-negative": (b"complete " + IDB + b" -1\r\n", "Invalid result size", False),
    "complete-size-over-max": (b"complete " + IDB + b" 1048577\r\n", "Invalid result size", True),
    "complete-block-mismatch": (b"complete " + IDB + b" 2\r\npong\r\n", "Invalid result size", True),
    "fail-size-non-numeric": (b"fail " + IDB + b" x\r\n", "Invalid result size", False),
    "fail-size-over-max": (b"fail " + IDB + b" 1048577\r\n", "Invalid result size", True),
    "fail-block-mismatch": (b"fail " + IDB + b" 2\r\npong\r\n", "Invalid result size", True),
    # --- Invalid ID
    "id-delete": (b"delete " + BAD_ID + b"\r\n", "Invalid ID", True),
    "id-no-hyphens": (b"delete 6ba7b8109dad11d180b400c04fd430c4\r\n", "Invalid ID", True),
    "id-braces": (b"delete {" + IDB + b"}\r\n", "Invalid ID", True),
    "id-non-hex": (b"delete 6ba7b810-9dad-11d1-80b4-00c04fd430cg\r\n", "Invalid ID", True),
    "id-add": (add(id=BAD_ID), "Invalid ID", True),
    "id-run": (run(id=b"x"), "Invalid ID", True),
    "id-result": (b"result nope 10\r\n", "Invalid ID", True),
    "id-complete": (b"complete " + BAD_ID + b" 4\r\npong\r\n", "Invalid ID", True),
    "id-fail": (b"fail " + BAD_ID + b" 4\r\npong\r\n", "Invalid ID", True),
    "id-inspect-job": (b"inspect job " + BAD_ID + b"\r\n", "Invalid ID", True),
    # --- Invalid Name
    "name-bad-char-add": (add(name=b"ping!"), "Invalid Name", True),
    "name-slash-run": (run(name=b"a/b"), "Invalid Name", True),
    "name-256-add": (add(name=NAME_256), "Invalid Name", True),
    "name-bad-char-lease": (b"lease ok b@d 100\r\n", "Invalid Name", True),
    "name-256-lease": (b"lease " + NAME_256 + b" 100\r\n", "Invalid Name", True),
    "name-inspect-queue": (b"inspect queue a:b\r\n", "Invalid Name", True),
    "name-inspect-jobs": (b"inspect jobs " + NAME_256 + b" 0 10\r\n", "Invalid Name", True),
    "name-non-ascii": ("inspect queue caf\u00e9\r\n".encode(), "Invalid Name", True),
    # --- Invalid TTR
    "ttr-zero": (add(ttr=b"0"), "Invalid TTR", True),
    "ttr-over-max": (add(ttr=b"86400001"), "Invalid TTR", True),
    "ttr-non-numeric": (add(ttr=b"1s"), "Invalid TTR", True),
    "ttr-run-zero": (run(ttr=b"0"), "Invalid TTR", True),
    "ttr-schedule-over-max": (schedule(ttr=b"86400001"), "Invalid TTR", True),
    # --- Invalid TTL
    "ttl-zero": (add(ttl=b"0"), "Invalid TTL", True),
    "ttl-2-64": (add(ttl=str(2 ** 64).encode()), "Invalid TTL", True),
    "ttl-schedule-zero": (schedule(ttl=b"0"), "Invalid TTL", True),
    # --- Invalid Time
    "time-bad-format-no-z": (schedule(b"2016-06-14T06:46:46"), "Invalid Time", True),
    "time-bad-format-space": (schedule(b"2016-06-14_06:46:46Z"), "Invalid Time", True),
    "time-bad-format-offset": (schedule(b"2016-06-14T06:46:46+00:00"), "Invalid Time", True),
    "time-bad-format-epoch": (schedule(b"1465886806"), "Invalid Time", True),
    "time-bad-format-fraction": (schedule(b"2016-06-14T06:46:46.5Z"), "Invalid Time", True),
    "time-impossible-feb-30": (schedule(b"2016-02-30T00:00:00Z"), "Invalid Time", True),
    "time-impossible-month-13": (schedule(b"2016-13-01T00:00:00Z"), "Invalid Time", True),
    "time-impossible-hour-25": (schedule(b"2016-06-14T25:00:00Z"), "Invalid Time", True),
    "time-impossible-feb-29": (schedule(b"2015-02-29T00:00:00Z"), "Invalid Time", True),
    # --- Invalid Max Attempts / Max Fails / Priority
    "max-attempts-256": (add(flags=b" -max-attempts=256"), "Invalid Max Attempts", True),
    "max-attempts-negative": (add(flags=b" -max-attempts=-1"), "Invalid Max Attempts", True),
    "max-fails-256": (add(flags=b" -max-fails=256"), "Invalid Max Fails", True),
    "max-fails-non-numeric": (schedule(flags=b" -max-fails=x"), "Invalid Max Fails", True),
    "priority-2-31": (add(flags=b" -priority=2147483648"), "Invalid Priority", True),
    "priority-below-min": (add(flags=b" -priority=-2147483649"), "Invalid Priority", True),
    "priority-non-numeric": (run(flags=b" -priority=high"), "Invalid Priority", True),
    # --- Invalid wait timeout
    "wait-lease-over-max": (b"lease ping 86400001\r\n", "Invalid wait timeout", True),
    "wait-lease-negative": (b"lease ping -1\r\n", "Invalid wait timeout", True),
    "wait-result-over-max": (b"result " + IDB + b" 86400001\r\n", "Invalid wait timeout", True),
    "wait-result-non-numeric": (b"result " + IDB + b" soon\r\n", "Invalid wait timeout", True),
    "wait-run-over-max": (run(timeout=b"86400001"), "Invalid wait timeout", True),
    # --- Invalid cursor offset
    "offset-queues-non-numeric": (b"inspect queues x 10\r\n", "Invalid cursor offset", True),
    "offset-queues-negative": (b"inspect queues -1 10\r\n", "Invalid cursor offset", True),
    "offset-jobs": (b"inspect jobs ping x 10\r\n", "Invalid cursor offset", True),
    "offset-scheduled": (b"inspect scheduled-jobs ping -5 10\r\n", "Invalid cursor offset", True),
    # --- Invalid limit
    "limit-zero": (b"inspect queues 0 0\r\n", "Invalid limit", True),
    "limit-101": (b"inspect queues 0 101\r\n", "Invalid limit", True),
    "limit-jobs-zero": (b"inspect jobs ping 0 0\r\n", "Invalid limit", True),
    "limit-scheduled-101": (b"inspect scheduled-jobs ping 0 101\r\n", "Invalid limit", True),
    "limit-non-numeric": (b"inspect jobs ping 0 ten\r\n", "Invalid limit", True),
}


@pytest.mark.parametrize("data, message, exact", list(VALIDATION.values()),
                         ids=list(VALIDATION))
def test_validation_error(data, message, exact):
    cmds = decode(data)
    assert cmds, "nothing decoded"
    assert cmds[0].route == LOCAL
    assert cmds[0].reply == ce(message)


@pytest.mark.parametrize("data, message, exact", list(VALIDATION.values()),
                         ids=list(VALIDATION))
def test_resync_after_error(data, message, exact):
    """After any error, a pipelined command that follows still decodes."""
    codec = WorkqCodec()
    if b"1048577" in data:           # an oversized block's bytes follow and are skipped
        cmds = codec.receive(data)
        assert len(cmds) == 1
        cmds += codec.receive(b"z" * 1048577 + b"\r\n" + DELETE)
    else:
        cmds = codec.receive(data + DELETE)
    assert cmds[0].reply == ce(message)
    assert_delete(cmds[-1])
    if exact:
        assert len(cmds) == 2, [c.reply for c in cmds]
    else:
        assert all(c.route == LOCAL for c in cmds[:-1])


def test_oversized_block_skipped_in_chunks():
    codec = WorkqCodec()
    out = codec.receive(b"add " + IDB + b" ping 1000 60000 2000000\r\n")
    assert [c.reply for c in out] == [ce("Invalid payload size")]
    block = bytes(range(256)) * (2000000 // 256) + b"\r\n" * 64  # 2000000 bytes, CRLF-laden
    block = block[:2000000]
    assert len(block) == 2000000
    rest = block + b"\r\n" + DELETE
    got = []
    for i in range(0, len(rest), 65536):
        got += codec.receive(rest[i:i + 65536])
    assert len(got) == 1
    assert_delete(got[0])


def test_oversized_result_block_skipped():
    codec = WorkqCodec()
    out = codec.receive(b"complete " + IDB + b" 1048577\r\n")
    assert [c.reply for c in out] == [ce("Invalid result size")]
    block = b"\r\n" * 524288 + b"x"                  # 1048577 bytes full of CRLFs
    assert len(block) == 1048577
    got = codec.receive(block[:600000])
    got += codec.receive(block[600000:] + b"\r\n" + DELETE)
    assert len(got) == 1, [c.reply for c in got]
    assert_delete(got[0])


def test_block_shorter_than_declared_resyncs_at_next_crlf():
    codec = WorkqCodec()
    # declared 10, sent 4: the codec cannot know until enough bytes arrive
    assert codec.receive(b"add " + IDB + b" ping 1000 60000 10\r\npong\r\n") == []
    got = codec.receive(DELETE + b"lease ping 0\r\n")
    assert [c.reply for c in got[:1]] == [ce("Invalid payload size")]
    assert_delete(got[1])
    assert got[2].op == "lease"
    assert len(got) == 3


def test_block_longer_than_declared_resyncs_at_next_crlf():
    got = decode(b"add " + IDB + b" ping 1000 60000 2\r\npong\r\n" + DELETE)
    assert [c.reply for c in got[:1]] == [ce("Invalid payload size")]
    assert_delete(got[1])
    assert len(got) == 2


def test_block_longer_than_declared_split_before_its_crlf():
    """The bad block's CRLF has not arrived when the mismatch is seen."""
    codec = WorkqCodec()
    got = codec.receive(b"add " + IDB + b" ping 1000 60000 2\r\npong")
    got += codec.receive(b"\r\n" + DELETE)
    assert [c.reply for c in got[:1]] == [ce("Invalid payload size")]
    assert_delete(got[-1])
    assert len(got) == 2, [c.reply for c in got]


def test_block_longer_than_declared_byte_by_byte():
    data = b"add " + IDB + b" ping 1000 60000 2\r\npongpong\r\n" + DELETE
    codec = WorkqCodec()
    got = []
    for i in range(len(data)):
        got += codec.receive(data[i:i + 1])
    assert [c.reply for c in got[:1]] == [ce("Invalid payload size")]
    assert_delete(got[-1])
    assert len(got) == 2, [c.reply for c in got]


# ================================================================ streaming
FULL_ADD = (b"add " + IDB + b" ping 1000 60000 4 -priority=10 -max-attempts=3 -max-fails=1\r\n"
            b"pong\r\n")


def test_command_split_byte_by_byte():
    codec = WorkqCodec()
    for i in range(len(FULL_ADD) - 1):
        assert codec.receive(FULL_ADD[i:i + 1]) == []
    cmds = codec.receive(FULL_ADD[-1:])
    assert len(cmds) == 1
    assert cmds[0].op == "add"
    assert add_args(cmds[0]) == [ID, "ping", b"pong", 10, 1000, 60000, 3, 1, None]


def test_error_split_byte_by_byte():
    data = b"inspect queues 0 101\r\n"
    codec = WorkqCodec()
    for i in range(len(data) - 1):
        assert codec.receive(data[i:i + 1]) == []
    cmds = codec.receive(data[-1:])
    assert [c.reply for c in cmds] == [ce("Invalid limit")]


def test_empty_receive_returns_nothing():
    codec = WorkqCodec()
    assert codec.receive(b"") == []
    assert codec.receive(b"del") == []
    assert codec.receive(b"") == []
    assert_delete(codec.receive(DELETE[3:])[0])


PIPELINE = (FULL_ADD
            + SCHEDULE
            + RUN
            + RESULT
            + b"lease ping1 ping2 ping3 60000\r\n"
            + COMPLETE
            + b"fail " + IDB + b" 4\r\noops\r\n"
            + b"bogus\r\n"
            + DELETE
            + INSPECT_JOB + INSPECT_JOBS + INSPECT_SCHED + INSPECT_QUEUE + INSPECT_QUEUES
            + INSPECT_SERVER)
PIPELINE_OPS = ["add", "add", "run", "result", "lease", "complete", "fail", None, "delete",
                "inspect_job", "inspect_jobs", "inspect_scheduled", "inspect_queue",
                "inspect_queues", "inspect_server"]


def test_pipelined_commands_in_order():
    cmds = decode(PIPELINE)
    assert [c.op for c in cmds] == PIPELINE_OPS
    assert cmds[7].reply == ce("Unknown command")
    assert norm(cmds[6].args) == [ID, b"oops"]
    assert add_args(cmds[1])[-1] == 1465886806 * 1_000_000


def test_pipeline_byte_by_byte_matches_one_chunk():
    codec = WorkqCodec()
    cmds = []
    for i in range(len(PIPELINE)):
        cmds += codec.receive(PIPELINE[i:i + 1])
    whole = decode(PIPELINE)
    assert [(c.op, norm(c.args), c.reply) for c in cmds] == \
           [(c.op, norm(c.args), c.reply) for c in whole]


def test_pipeline_split_at_every_position():
    data = FULL_ADD + b"complete " + IDB + b" 2\r\n\r\n\r\n" + DELETE
    for i in range(len(data) + 1):
        codec = WorkqCodec()
        cmds = codec.receive(data[:i]) + codec.receive(data[i:])
        assert [c.op for c in cmds] == ["add", "complete", "delete"], i
        assert norm(cmds[1].args) == [ID, b"\r\n"], i


def test_errors_interleaved_in_pipeline_keep_order():
    data = (b"nope\r\n" + DELETE + b"inspect queues 0 0\r\n" + b"lease ping 0\r\n"
            + add(ttr=b"0") + COMPLETE + b"\r\n" + INSPECT_SERVER)
    cmds = decode(data)
    assert [c.op for c in cmds] == [None, "delete", None, "lease", None, "complete", None,
                                    "inspect_server"]
    assert [c.reply for c in cmds if c.op is None] == [
        ce("Unknown command"), ce("Invalid limit"), ce("Invalid TTR"), ce("Unknown command")]


def test_bare_lf_line_endings_accepted():
    data = (b"delete " + IDB + b"\n"
            + b"lease ping 0\n"
            + b"add " + IDB + b" ping 1000 60000 4\npong\r\n"
            + b"inspect server\r\n"
            + b"complete " + IDB + b" 2\nok\r\n"
            + b"\n"
            + b"inspect queue ping\n")
    cmds = decode(data)
    assert [c.op for c in cmds] == ["delete", "lease", "add", "inspect_server", "complete",
                                    None, "inspect_queue"]
    assert norm(cmds[2].args[:3]) == [ID, "ping", b"pong"]
    assert norm(cmds[4].args) == [ID, b"ok"]
    assert cmds[5].reply == ce("Unknown command")


BINARY = b"\r\n\x00a\r\nb\x00\r\n\r\r\n\n" + bytes(range(256)) + b"\r\n"


def test_binary_payload_round_trips():
    data = b"add " + IDB + b" ping 1000 60000 " + str(len(BINARY)).encode() + b"\r\n" + BINARY + b"\r\n"
    cmds = decode(data + DELETE)
    assert len(cmds) == 2
    assert cmds[0].args[2] == BINARY
    assert_delete(cmds[1])


def test_binary_payload_byte_by_byte():
    data = (b"run " + IDB + b" ping 1000 0 " + str(len(BINARY)).encode() + b"\r\n" + BINARY
            + b"\r\n" + b"complete " + IDB + b" " + str(len(BINARY)).encode() + b"\r\n" + BINARY
            + b"\r\n")
    codec = WorkqCodec()
    cmds = []
    for i in range(len(data)):
        cmds += codec.receive(data[i:i + 1])
    assert [c.op for c in cmds] == ["run", "complete"]
    assert cmds[0].args[2] == BINARY
    assert cmds[1].args[1] == BINARY


def test_binary_payload_rendered_back_in_lease_and_result():
    cmd = one(b"add " + IDB + b" ping 1000 60000 " + str(len(BINARY)).encode() + b"\r\n"
              + BINARY + b"\r\n")
    payload = cmd.args[2]
    out = render_for(LEASE)([OK, [ID, "ping", payload, 1, 0, 1000, 1, None]])
    assert out == (b"+OK 1\r\n" + IDB + b" ping " + str(len(BINARY)).encode() + b"\r\n"
                   + BINARY + b"\r\n")
    out = render_for(RESULT)([OK, [ID, 1, payload]])
    assert out == (b"+OK 1\r\n" + IDB + b" 1 " + str(len(BINARY)).encode() + b"\r\n"
                   + BINARY + b"\r\n")


def test_overlong_line_without_newline_errors_then_next_line_decodes():
    codec = WorkqCodec()
    cmds = codec.receive(b"a" * 70000)
    assert len(cmds) == 1
    assert cmds[0].route == LOCAL
    assert cmds[0].reply.startswith(b"-CLIENT-ERROR ")
    assert cmds[0].reply.endswith(b"\r\n")
    # The rest of the overlong line is dropped without further replies.
    assert codec.receive(b"a" * 70000) == []
    assert codec.receive(b"b" * 10) == []
    cmds = codec.receive(b"ccc\r\n" + DELETE)
    assert len(cmds) == 1
    assert_delete(cmds[0])


def test_overlong_line_in_one_chunk_with_newline():
    cmds = decode(b"lease " + b"x" * 70000 + b" 0\r\n" + DELETE)
    assert len(cmds) == 2
    assert cmds[0].route == LOCAL
    assert cmds[0].reply.startswith(b"-CLIENT-ERROR ")
    assert_delete(cmds[1])


def test_overlong_line_byte_count_just_over_limit():
    codec = WorkqCodec()
    assert codec.receive(b"a" * 65536) == []       # at the limit: still waiting
    cmds = codec.receive(b"a")                      # 65537 bytes, no newline
    assert len(cmds) == 1 and cmds[0].reply.startswith(b"-CLIENT-ERROR ")
    assert_delete(codec.receive(b"\r\n" + DELETE)[0])


def test_long_but_legal_line_decodes():
    names = [f"queue{i:05d}" for i in range(4000)]    # ~44 KB line
    line = ("lease " + " ".join(names) + " 100\r\n").encode()
    assert len(line) < 65536
    cmd = one(line)
    assert cmd.op == "lease"
    assert norm(cmd.args) == [names, 100]


# ====================================================== one request, one reply
# A refused block command never lets its block be read as a command of its own
# (decisions file, "Every protocol"): when its size can be read, the block and
# its CRLF are skipped; when it cannot, parsing resumes at the next line.
ONE_REPLY = {
    "bad-name-readable-size": (b"add " + IDB + b" p!ng 1000 60000 4\r\npong\r\n", "Invalid Name"),
    "bad-flag-readable-size": (b"add " + IDB + b" ping 1000 60000 4 -k=\r\npong\r\n",
                               "Invalid command flags"),
    "flag-on-complete": (b"complete " + IDB + b" 4 -x=1\r\npong\r\n", "Invalid command args"),
    "size-mismatch": (b"add " + IDB + b" ping 1000 60000 2\r\npong\r\n", "Invalid payload size"),
}


@pytest.mark.parametrize("data, message", list(ONE_REPLY.values()), ids=list(ONE_REPLY))
def test_refused_block_command_with_readable_size_answers_once(data, message):
    cmds = decode(data + DELETE)
    assert [c.reply for c in cmds[:-1]] == [ce(message)]
    assert_delete(cmds[-1])


@pytest.mark.parametrize("data, message", list(ONE_REPLY.values()), ids=list(ONE_REPLY))
def test_refused_block_command_byte_by_byte(data, message):
    codec = WorkqCodec()
    cmds = []
    for i in range(len(data + DELETE)):
        cmds += codec.receive((data + DELETE)[i:i + 1])
    assert [c.reply for c in cmds[:-1]] == [ce(message)]
    assert_delete(cmds[-1])


# A block command with too few arguments has no readable size, whatever its
# line holds: it is answered at once, and the next line (its would-be block,
# here) is a command of its own.
WRONG_COUNT = {
    "size-missing": (b"add " + IDB + b" ping 1000\r\n", "Invalid command args", []),
    "size-missing-ttl-like": (b"add " + IDB + b" ping 1000 4\r\npong\r\n", "Invalid command args",
                              ["Unknown command"]),
    "complete-size-not-a-number": (b"complete " + IDB + b" x 4\r\npong\r\n", "Invalid command args",
                                   ["Unknown command"]),
    "fail-missing-id": (b"fail 4\r\npong\r\n", "Invalid command args", ["Unknown command"]),
    "bad-flag-and-count": (b"add " + IDB + b" ping 1000 4 -k=\r\npong\r\n", "Invalid command flags",
                           ["Unknown command"]),
    "huge-number-in-size-place": (b"add " + IDB + b" ping 1000 99999999\r\n", "Invalid command args", []),
}


@pytest.mark.parametrize("data, message, after", list(WRONG_COUNT.values()), ids=list(WRONG_COUNT))
def test_wrong_argument_count_is_answered_at_once(data, message, after):
    codec = WorkqCodec()
    line_end = data.index(b"\n") + 1
    cmds = codec.receive(data[:line_end])     # nothing more is sent: the answer must not wait
    assert [c.reply for c in cmds] == [ce(message)]
    cmds = codec.receive(data[line_end:] + DELETE)
    assert [c.reply for c in cmds[:-1]] == [ce(m) for m in after]
    assert_delete(cmds[-1])


# Too many arguments leave the size readable at its place: the block is read
# (or skipped when oversized) and the request answered once.
TOO_MANY = {
    "priority-space-form": (b"add " + IDB + b" ping 1000 60000 4 -priority 5\r\npong\r\n",
                            "Invalid command args"),
    "space-form-run": (b"run " + IDB + b" ping 1000 10 4 -priority 5\r\nping\r\n", "Invalid command args"),
    "space-form-schedule": (b"schedule " + IDB + b" ping 1 2 2016-06-14T06:46:46Z 4 -priority 1\r\n"
                            b"pong\r\n", "Invalid command args"),
    "block-with-crlf-inside": (b"add " + IDB + b" ping 1000 60000 6 extra\r\nab\r\ncd\r\n",
                               "Invalid command args"),
    "complete-extra-arg": (b"complete " + IDB + b" 4 x\r\npong\r\n", "Invalid command args"),
    "fail-extra-args": (b"fail " + IDB + b" 4 x y\r\npong\r\n", "Invalid command args"),
    "bad-flag-first": (b"add " + IDB + b" ping 1000 60000 4 -k= 5\r\npong\r\n", "Invalid command flags"),
    "block-mismatch": (b"add " + IDB + b" ping 1000 60000 2 -priority 5\r\npong\r\n",
                       "Invalid command args"),
}


@pytest.mark.parametrize("data, message", list(TOO_MANY.values()), ids=list(TOO_MANY))
def test_too_many_arguments_read_the_block_and_answer_once(data, message):
    for cut in range(len(data) + 1):
        codec = WorkqCodec()
        cmds = codec.receive(data[:cut]) + codec.receive(data[cut:] + DELETE)
        assert [c.reply for c in cmds[:-1]] == [ce(message)], cut
        assert_delete(cmds[-1])


def test_too_many_arguments_with_an_oversized_block_skip_it():
    codec = WorkqCodec(max_payload=4)
    cmds = codec.receive(b"add " + IDB + b" ping 1000 60000 9 x\r\n" + b"123456789\r\n" + DELETE)
    assert [c.reply for c in cmds[:-1]] == [ce("Invalid command args")]
    assert_delete(cmds[-1])


UNREADABLE = {
    # size not a number: the error, then the block line is a line of its own
    "size-non-numeric": (b"add " + IDB + b" ping 1000 60000 abc\r\n", "Invalid payload size"),
    "size-negative": (b"add " + IDB + b" ping 1000 60000 -1\r\n", "Invalid payload size"),
    "wrong-count-no-number": (b"add " + IDB + b" ping 1000 60000 4x 7y\r\n", "Invalid command args"),
    "wrong-count-only-flags": (b"add -priority 5\r\n", "Invalid command args"),
    "wrong-count-over-max": (b"add " + IDB + b" ping 1000 1048577\r\n", "Invalid command args"),
    "complete-no-args": (b"complete\r\n", "Invalid command args"),
}


@pytest.mark.parametrize("data, message", list(UNREADABLE.values()), ids=list(UNREADABLE))
def test_refused_block_command_with_unreadable_size_resumes_at_the_next_line(data, message):
    cmds = decode(data + DELETE)
    assert [c.reply for c in cmds[:-1]] == [ce(message)]
    assert_delete(cmds[-1])


def test_add_with_non_numeric_size_reads_its_block_as_the_next_line():
    cmds = decode(b"add " + IDB + b" ping 1000 60000 abc\r\npong\r\n" + DELETE)
    assert [c.reply for c in cmds[:2]] == [ce("Invalid payload size"), ce("Unknown command")]
    assert_delete(cmds[2])


# ============================================================ payload limit
@pytest.mark.parametrize("limit", [0, 5, MAX_PAYLOAD])
def test_max_payload_bounds_payload_and_result(limit):
    codec = WorkqCodec(max_payload=limit)
    block = b"x" * limit
    size = str(limit).encode()
    over = str(limit + 1).encode()
    cmds = codec.receive(b"add " + IDB + b" ping 1000 60000 " + size + b"\r\n" + block + b"\r\n"
                         + b"complete " + IDB + b" " + size + b"\r\n" + block + b"\r\n")
    assert [c.op for c in cmds] == ["add", "complete"]
    assert cmds[0].args[2] == block and cmds[1].args[1] == block
    cmds = codec.receive(b"add " + IDB + b" ping 1000 60000 " + over + b"\r\n" + block + b"x\r\n"
                         + b"fail " + IDB + b" " + over + b"\r\n" + block + b"y\r\n" + DELETE)
    assert [c.reply for c in cmds[:2]] == [ce("Invalid payload size"), ce("Invalid result size")]
    assert_delete(cmds[2])


def test_max_payload_is_a_keyword_option():
    assert WorkqCodec().max_payload == MAX_PAYLOAD
    assert WorkqCodec(max_payload=7).max_payload == 7


# ========================================================= reply framing
HOSTILE = "a\r\nb c\x00\t\x7f\u2028\u00a0é"


def lines_of(reply: bytes):
    """A reply's CRLF-separated lines (the last CRLF ends the reply)."""
    assert reply.endswith(b"\r\n")
    return reply[:-2].split(b"\r\n")


def test_lease_reply_never_breaks_its_line_with_a_hostile_name():
    reply = render_for(LEASE)([OK, [ID, HOSTILE, b"ping", 1, 0, 1000, 1, None]])
    header, job, payload = lines_of(reply)
    assert header == b"+OK 1" and payload == b"ping"
    id, name, size = job.split(b" ")
    assert id == IDB and size == b"4"
    assert name == "a\\x0d\\x0ab\\x20c\\x00\\x09\\x7f\\u2028\\xa0é".encode()


def test_inspect_job_reply_keeps_its_key_count_with_a_hostile_name():
    reply = render_for(INSPECT_JOB)([OK, job_view(name=HOSTILE)])
    lines = lines_of(reply)
    assert lines[0] == b"+OK 1"
    id, count = lines[1].split(b" ")
    assert len(lines) == 2 + int(count) == 14
    assert all(len(line.split(b" ")) == 2 for line in lines[2:])


def test_inspect_queues_reply_keeps_its_shape_with_hostile_and_empty_names():
    reply = render_for(INSPECT_QUEUES)([OK, [[HOSTILE, 1, 2], ["", 0, 0], ["ok", 3, 4]]])
    lines = lines_of(reply)
    assert len(lines) == 1 + 3 * 3
    heads = lines[1::3]
    assert all(len(h.split(b" ")) == 2 and h.endswith(b" 2") for h in heads)
    assert heads[1] == b'"" 2' and heads[2] == b"ok 2"
    reply = render_for(INSPECT_QUEUE)([OK, [HOSTILE, 1, 2]])
    assert len(lines_of(reply)) == 4


# ================================================================ names
@pytest.mark.parametrize("name", ["ping", "a.b-c_D9", "x" * 255, "-abc", "-"])
def test_seed_names_are_accepted(name):
    assert one(add(name=name.encode())).key == name


@pytest.mark.parametrize("raw", [b"x" * 256, b"caf\xc3\xa9", b"a\x00", b"\xff", b"a\x0bb"])
def test_names_outside_the_seed_charset_are_refused(raw):
    assert error_reply(b"inspect queue " + raw + b"\r\n") == ce("Invalid Name")
