"""The router's job directory: one small entry per job, exact placement."""
from queueserver.links.directory import SHARED, JobDirectory


def test_place_and_forget():
    d = JobDirectory()
    assert d.place("a", 1) is True
    assert d.place("a", 1) is False
    assert d.shard_of("a") == 1 and d.shard_of("b") is None
    d.forget("a", 0)                    # another shard's report does not touch it
    assert d.shard_of("a") == 1
    d.forget("a", 1)
    assert d.shard_of("a") is None


def test_an_id_on_two_shards_is_shared_and_asks_everyone():
    d = JobDirectory()
    d.place("a", 0)
    d.place("a", 2)
    assert d.shard_of("a") == SHARED
    d.forget("a", 0)                    # cannot tell which copy left: stays shared
    assert d.shard_of("a") == SHARED


def test_learn_and_forget_shard():
    d = JobDirectory()
    d.learn(1, ["a", "b"])
    d.place("c", 0)
    assert d.shard_of("b") == 1
    d.forget_shard(1)
    assert d.shard_of("a") is None and d.shard_of("c") == 0
    d.forget_all(["c"], 0)
    assert len(d) == 0
