"""The router's compact job directory against a plain dict model: same
answers for placing, looking up and forgetting many jobs on several shards,
and a few bytes per job."""
from __future__ import annotations

import random
import tracemalloc

from queueserver.links import directory as D
from queueserver.links.directory import SHARED, JobDirectory


def test_the_directory_answers_as_a_dict_would():
    rnd = random.Random(5)
    d, model = JobDirectory(), {}
    ids = [f"job-{i}" for i in range(20_000)]
    for step in range(60_000):
        id = rnd.choice(ids)
        shard = rnd.randrange(4)
        action = rnd.random()
        if action < 0.5:
            known = model.get(id)
            assert d.place(id, shard) is (known is None)
            model[id] = shard if known is None or known == shard else SHARED
        elif action < 0.8:
            d.forget(id, shard)
            if model.get(id) == shard:
                del model[id]
        else:
            assert d.shard_of(id) == model.get(id)
        if step % 20_000 == 0:
            gone = rnd.randrange(4)
            d.forget_shard(gone)
            model = {k: v for k, v in model.items() if v != gone}
    assert len(d) == len(model)
    assert all(d.shard_of(id) == model.get(id) for id in ids)
    d.forget_all(list(model), 3)
    assert all(d.shard_of(id) == model.get(id) for id in ids if model.get(id) != 3)


def test_an_entry_is_only_found_where_entries_start():
    prefix = bytes(range(1, 5))
    # The prefix appears across the first two entries, and as the third.
    bucket = b"\x00" * 2 + prefix + b"\x00" * 4 + prefix + b"\x01"
    assert bucket.find(prefix) == 2
    assert D._find(bucket, prefix) == 10
    assert D._find(bucket[:10], prefix) == -1
    assert D._find(prefix + b"\x00", prefix) == 0


def test_a_shard_number_must_fit_an_entry():
    d = JobDirectory()
    d.place("a", 254)
    assert d.shard_of("a") == 254
    try:
        d.place("b", 255)
    except ValueError:
        pass
    else:
        raise AssertionError("shard 255 is the shared mark")


def test_a_job_costs_the_directory_a_few_bytes():
    ids = [f"{i:08x}-0000-4000-8000-{i:012x}" for i in range(200_000)]
    tracemalloc.start()
    try:
        d = JobDirectory()
        before = tracemalloc.get_traced_memory()[0]
        for i, id in enumerate(ids):
            d.place(id, i % 2)
        per_job = (tracemalloc.get_traced_memory()[0] - before) / len(ids)
    finally:
        tracemalloc.stop()
    # Measured ~7.7 at 200,000 jobs (~5.5 at a million; 8-byte entries gave
    # ~15 and ~11); a dict of int to int: ~90.
    assert per_job < 9, per_job
