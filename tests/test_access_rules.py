"""The access file (queueserver.access): parsing, its errors, resolving an
identity, and each request's check. No I/O beyond one temporary file."""
from __future__ import annotations

import pytest

from queueserver.access import JOB_QUEUE, AccessError, load, parse
from queueserver.access.rules import MAX_CACHED, Matcher
from queueserver.engine.ops import ALL_VERBS, OPS, FROM_CLIENT
from queueserver.engine.status import FORBIDDEN, NOT_FOUND
from queueserver.protocols.base import ALL, BY_ID, BY_NAME, BY_NAMES, BY_NUMBER, Command

EXAMPLE = """
[identities.ingest]
networks = ["10.1.0.0/16"]
certificates = ["ingest.example"]
produce = ["orders.*", "mail"]
inspect = ["orders.*"]

[identities.workers]
networks = ["10.1.2.0/24", "fd00::/8"]
consume = ["orders.*"]

[identities.ops]
certificates = ["oncall", "backup.example"]
networks = ["127.0.0.1/32"]
produce = ["*"]
consume = ["*"]
inspect = ["*"]
admin = ["*"]
"""


def command(op: str, route: int, key: object) -> Command:
    return Command(op, (), route, key, None)


@pytest.fixture
def rules():
    return parse(EXAMPLE, "access.toml")


# ------------------------------------------------------------- resolving
def test_certificate_names_come_first(rules):
    assert rules.resolve(("ingest.example",), "127.0.0.1").name == "ingest"
    assert rules.resolve(("nobody", "backup.example"), "10.1.2.3").name == "ops"   # a SAN


def test_the_longest_network_wins(rules):
    assert rules.resolve((), "10.1.2.3").name == "workers"
    assert rules.resolve((), "10.1.3.3").name == "ingest"
    assert rules.resolve((), "fd00::1").name == "workers"
    assert rules.resolve((), "::ffff:127.0.0.1").name == "ops"   # a dual-stack listener's IPv4 client


def test_nothing_matches_is_unknown(rules):
    assert rules.resolve((), "192.168.0.1") is None
    assert rules.resolve(("stranger",), "") is None
    assert rules.resolve((), "not an address") is None


# -------------------------------------------------------------- checking
def test_a_request_by_queue_name(rules):
    ingest = rules.identities["ingest"].permissions
    assert ingest.refusal(command("add", BY_NAME, "orders.eu")) is None
    assert ingest.refusal(command("add", BY_NAME, "mail")) is None
    assert ingest.refusal(command("add", BY_NAME, "mailer")) == \
        "Permission denied: ingest may not produce queue mailer"
    assert ingest.refusal(command("lease", BY_NAME, "orders.eu")) == \
        "Permission denied: ingest may not consume queue orders.eu"
    assert ingest.refusal(command("size", BY_NAME, "orders.x")) is None


def test_a_lease_over_several_queues_checks_each(rules):
    workers = rules.identities["workers"].permissions
    assert workers.refusal(command("lease", BY_NAMES, ["orders.a", "orders.b"])) is None
    assert "queue mail" in workers.refusal(command("lease", BY_NAMES, ["orders.a", "mail"]))


def test_a_job_by_id_or_number_waits_for_its_queue(rules):
    workers = rules.identities["workers"].permissions
    for op, route in (("complete", BY_ID), ("delete_number", BY_NUMBER), ("inspect_job", BY_ID)):
        assert workers.refusal(command(op, route, "x")) == JOB_QUEUE
    complete = command("complete", BY_ID, "x")
    assert workers.job_refusal(complete, "orders.a") is None
    assert workers.job_refusal(complete, "mail") == (NOT_FOUND, "")   # may not see it at all
    ingest = rules.identities["ingest"].permissions
    assert ingest.job_refusal(complete, "orders.a") == (
        FORBIDDEN, "Permission denied: ingest may not consume queue orders.a")   # sees it, may not touch it


def test_server_wide_requests_need_every_queue(rules):
    ingest = rules.identities["ingest"].permissions
    assert ingest.refusal(command("inspect_server", ALL, None)) == \
        "Permission denied: ingest may not inspect every queue"
    assert rules.identities["ops"].permissions.refusal(command("inspect_queues", ALL, None)) is None
    assert rules.identities["ops"].permissions.refusal(command("delete", BY_ID, "x")) is None   # no lookup


def test_a_verb_left_out_allows_nothing(rules):
    workers = rules.identities["workers"].permissions
    for verb in ("produce", "inspect", "admin"):
        assert not workers.may(verb, "orders.a")


def test_every_clients_operation_is_checked(rules):
    """Every client's operation maps to a verb the matchers know."""
    nobody = parse('[identities.n]\nnetworks = ["10.0.0.0/8"]\n').identities["n"].permissions
    for name, op in OPS.items():
        if op.flags & FROM_CLIENT:
            assert nobody.refusal(command(name, BY_NAME, "q")) is not None, name


def test_matcher_answers_are_cached_and_bounded():
    matcher = Matcher(["a*", "b?"])
    assert matcher("abc") and matcher("bx") and not matcher("bxx") and not matcher("c")
    assert matcher._seen == {"abc": True, "bx": True, "bxx": False, "c": False}
    for i in range(MAX_CACHED + 5):
        matcher(f"q{i}")
    assert len(matcher._seen) <= MAX_CACHED
    assert Matcher(["[ab]x"])("bx") and not Matcher([])("x")


# ---------------------------------------------------------------- errors
@pytest.mark.parametrize("text, error", [
    ("identities = 3", "access.toml: identities: no identity is defined"),
    ("[other]\nx = 1", "access.toml: other: unknown key"),
    ("[identities.a]\nproduce = ['*']", "access.toml: identities.a: names no networks and no certificates"),
    ("[identities.a]\nnetworks = ['10.0.0.0/8']\nproduces = ['*']", "access.toml: identities.a.produces: unknown key"),
    ("[identities.a]\nnetworks = ['10.0.0.300/8']", "access.toml: identities.a.networks: '10.0.0.300/8' is not"),
    ("[identities.a]\nnetworks = ['10.0.0.1/8']", "access.toml: identities.a.networks: '10.0.0.1/8' is not"),
    ("[identities.a]\nnetworks = '10.0.0.0/8'", "access.toml: identities.a.networks: must be a list of strings"),
    ("[identities.a]\nnetworks = ['10.0.0.0/8']\nconsume = ['a b']", "access.toml: identities.a.consume: 'a b'"),
    ("[identities.'a b']\nnetworks = ['10.0.0.0/8']", "access.toml: identities.a b: an identity's name"),
    ("[identities.a]\nnetworks = ['10.0.0.0/8']\n[identities.b]\nnetworks = ['10.0.0.0/8']",
     "access.toml: identities.b.networks: '10.0.0.0/8' is a's already"),
    ("[identities.a]\ncertificates = ['x']\n[identities.b]\ncertificates = ['x']",
     "access.toml: identities.b.certificates: 'x' is a's already"),
    ("[identities.a\n", "access.toml: not valid TOML"),
])
def test_a_bad_file_is_one_clear_line(text, error):
    with pytest.raises(AccessError) as raised:
        parse(text, "access.toml")
    message = str(raised.value)
    assert message.startswith(error), message
    assert "\n" not in message


def test_load_reads_the_file_and_names_it(tmp_path):
    path = tmp_path / "access.toml"
    path.write_text(EXAMPLE)
    assert set(load(str(path)).identities) == {"ingest", "workers", "ops"}
    with pytest.raises(AccessError, match=f"^{tmp_path}/missing.toml: cannot read the access file"):
        load(str(tmp_path / "missing.toml"))


def test_every_verb_has_a_key():
    rules = parse("[identities.a]\nnetworks = ['10.0.0.0/8']\n" + "".join(f"{v} = ['q{v}']\n" for v in ALL_VERBS))
    permissions = rules.identities["a"].permissions
    assert all(permissions.may(verb, f"q{verb}") for verb in ALL_VERBS)
