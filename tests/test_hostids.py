"""The host's shared table of job ids (queueserver/shard/hostids.py): its
semantics in one process, then real processes racing on one memory file
(exactly one winner per id, stripes growing under everyone's feet), and a
process killed with SIGKILL while it holds a stripe's lock."""
from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import textwrap

import pytest

from queueserver.shard.hostids import FIRST_CAPACITY, STRIPE_BITS, HostIds, key_of


@pytest.fixture
def table():
    fd = HostIds.create()
    ids = HostIds(fd)
    yield ids
    ids.close()
    os.close(fd)


def test_a_claimed_key_is_refused_to_others_until_forgotten(table):
    key = key_of("6ba7b810-9dad-11d1-80b4-00c04fd430c8")
    assert table.claim(key, 3) == []
    assert table.claim(key, 3) == []          # its own: granted again, one entry
    assert table.claim(key, 5) == [3]         # another's: nothing written
    assert table.owners(key) == [3]
    table.forget(key, 5)                      # not 5's: nothing happens
    assert table.owners(key) == [3]
    table.forget(key, 3)
    assert table.owners(key) == []
    assert table.claim(key, 5) == []
    assert table.owners(key) == [5]
    assert table.counts()["entries"] == 1


def test_an_entry_found_stale_is_taken_beside(table):
    """A shard asked about its entry does not hold the id (a twin key, or a
    job lost in a crash): the claim goes through beside it, and a third
    shard meets both."""
    key = key_of("job")
    assert table.claim(key, 1) == []
    assert table.claim(key, 2, checked=[1]) == []
    assert sorted(table.owners(key)) == [1, 2]
    assert sorted(table.claim(key, 7)) == [1, 2]
    assert table.claim(key, 7, checked=[1]) == [2]


def test_a_stripe_grows_and_drops_removed_entries(table):
    """Thousands of keys in one stripe: it is rebuilt larger again and
    again, every key still found; after churn the removed slots go."""
    top = 5 << (64 - STRIPE_BITS)
    keys = random.Random(1).sample(range(1 << (64 - STRIPE_BITS)), 5000)
    keys = [top | k for k in keys]
    for key in keys:
        assert table.claim(key, 0) == []
    assert all(table.owners(key) == [0] for key in keys)
    for key in keys[:4000]:
        table.forget(key, 0)
    for key in keys[:4000]:
        assert table.claim(key ^ 1, 2) == [] or key ^ 1 in keys
    counts = table.counts()
    assert counts["entries"] == len({*keys[4000:], *(k ^ 1 for k in keys[:4000])})
    assert counts["slots_used"] < 5000 + 4000   # removed slots were reused or dropped
    assert all(table.owners(key) == [0] for key in keys[4000:])


def test_replace_owner_keeps_exactly_what_a_restarted_shard_holds(table):
    rng = random.Random(2)
    old = [rng.getrandbits(64) for _ in range(3000)]
    for key in old:
        table.claim(key, 4)
    other = rng.getrandbits(64)
    table.claim(other, 1)
    recovered = old[:1000] + [rng.getrandbits(64) for _ in range(500)]
    table.replace_owner(4, recovered)
    assert all(table.owners(key) == [4] for key in recovered)
    assert all(table.owners(key) == [] for key in old[1000:])
    assert table.owners(other) == [1]
    assert table.counts()["entries"] == 1501


CHILD = textwrap.dedent("""
    import random, sys
    from queueserver.shard.hostids import HostIds
    fd, owner, seed, path = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
    keys = [int(line) for line in open(path)]
    random.Random(seed).shuffle(keys)
    table = HostIds(fd)
    won = [key for key in keys if table.claim(key, owner) == []]
    print(" ".join(map(str, won)))
""")


def test_racing_processes_each_key_has_one_winner(table, tmp_path):
    """Four processes claim the same keys in different orders, half of them
    in one stripe (which grows under them): every key is won by exactly
    one, and the table names that one."""
    rng = random.Random(3)
    crowded = 9 << (64 - STRIPE_BITS)
    keys = [rng.getrandbits(64) for _ in range(4000)] + \
           [crowded | rng.getrandbits(64 - STRIPE_BITS) for _ in range(4000)]
    keys = list(dict.fromkeys(keys))
    path = tmp_path / "keys"
    path.write_text("\n".join(map(str, keys)))
    procs = [subprocess.Popen([sys.executable, "-c", CHILD, str(table.fd), str(owner), str(owner), str(path)],
                              pass_fds=(table.fd,), stdout=subprocess.PIPE, text=True)
             for owner in range(4)]
    won = {}
    for owner, proc in enumerate(procs):
        out, _ = proc.communicate(timeout=120)
        assert proc.returncode == 0
        for key in map(int, out.split()):
            assert key not in won, f"{key} won by {won[key]} and {owner}"
            won[key] = owner
    assert sorted(won) == sorted(keys)
    assert all(table.owners(key) == [owner] for key, owner in won.items())
    assert table.counts()["entries"] == len(keys)
    assert FIRST_CAPACITY < 4000   # (the crowded stripe did grow)


HOLDER = textwrap.dedent("""
    import sys, time
    from queueserver.shard.hostids import HostIds, key_of
    table = HostIds(int(sys.argv[1]))
    table._lock(key_of("held") >> 52)
    print("holding", flush=True)
    time.sleep(60)
""")


def test_a_process_killed_holding_a_stripe_blocks_nobody(table):
    proc = subprocess.Popen([sys.executable, "-c", HOLDER, str(table.fd)], pass_fds=(table.fd,),
                            stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline() == "holding\n"
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
        assert table.claim(key_of("held"), 1) == []   # the kernel released its lock (else: a hang)
    finally:
        proc.kill()
        proc.wait()


def test_the_only_shard_claims_nothing_in_the_table(table):
    """A server's only shard answers an add at once and writes nothing to
    the host's table (its engine refuses an id it holds: two locks per add
    would buy nothing); a shard beside others claims its new ids there."""
    from queueserver.engine import Engine
    from queueserver.shard.homes import Homes

    def settle(*args):
        raise AssertionError(f"no verdict is waited for: {args}")

    id = "6ba7b810-9dad-11d1-80b4-00c04fd430c8"
    alone = Homes(0, 1, Engine(shard=0, shards=1), None, table, settle)
    reply = [0, [id, 1]]
    assert alone.claim(id, (-1, 1), reply) is reply
    assert table.counts()["entries"] == 0
    alone.left([id])
    beside = Homes(1, 2, Engine(shard=1, shards=2), None, table, settle)
    assert beside.claim(id, (-1, 2), reply) is reply
    assert table.owners(key_of(id)) == [1]
