"""The console's reads of engine state (queueserver.engine.browse), on the
pure engine with a fake clock: states, rows, pages, the oldest ready job
across priorities, bounded scans, and the console's own state changes
(release, requeue), which a log replays."""
from __future__ import annotations

import pytest

from queueserver.engine import browse
from queueserver.engine import job as J
from queueserver.engine.engine import Engine as PureEngine

from engine_helpers import (MS, SEC, T0, Engine, add, complete, fail, lease, leased_id, ready_ids,
                            scheduled_ids)


def ids(n, prefix="j"):
    return [f"{prefix}{i:04d}" for i in range(n)]


@pytest.fixture
def e():
    return Engine()


def test_states_and_rows(e):
    add(e, "ready", ttl=60_000, now=T0)
    add(e, "later", sched=T0 + 10 * SEC, now=T0)
    add(e, "held", ttr=5_000, ttl=0, now=T0)
    add(e, "done", now=T0)
    assert leased_id(lease(e, now=T0 + SEC)) == "ready"
    assert leased_id(lease(e, now=T0 + SEC)) == "held"
    complete(e, "ready", now=T0 + 2 * SEC)
    assert leased_id(lease(e, now=T0 + 2 * SEC)) == "done"
    jobs = e.inner.jobs
    assert browse.state_of(jobs["ready"]) == browse.FINISHED
    assert browse.state_of(jobs["later"]) == browse.SCHEDULED
    assert browse.state_of(jobs["held"]) == browse.LEASED
    row = browse.job_row(jobs["held"], T0 + 3 * SEC)
    assert row["state"] == "leased" and row["attempts"] == 1 and row["age"] == 3 * SEC
    assert row["ttr_left"] == 5 * SEC - 2 * SEC and row["ttl_left"] is None
    assert browse.job_row(jobs["ready"], T0 + 3 * SEC)["ttl_left"] == 57 * SEC
    detail = browse.job_detail(jobs["ready"], T0 + 3 * SEC)
    assert detail["outcome"] == "completed" and detail["result"] == b"result"
    assert detail["payload"] == b"payload" and detail["payload_size"] == 7
    assert browse.job_detail(jobs["later"], T0)["sched"] == T0 + 10 * SEC


def test_detail_previews_are_cut(e):
    add(e, "big", payload=b"x" * 10_000)
    detail = browse.job_detail(e.inner.jobs["big"], T0)
    assert len(detail["payload"]) == browse.PREVIEW_BYTES and detail["payload_size"] == 10_000


def test_line_pages_in_serving_order(e):
    names = ids(30)
    for i, id in enumerate(names):
        add(e, id, priority=i % 3, now=T0 + i)
    queue = e.inner.queues["q"]
    rows, total = browse.line_page(queue, browse.READY, 0, 10, T0 + SEC)
    assert total == 30
    assert [r["id"] for r in rows] == ready_ids(e)[:10]
    rows, _ = browse.line_page(queue, browse.READY, 25, 10, T0 + SEC)
    assert [r["id"] for r in rows] == ready_ids(e)[25:]
    for i in range(5):
        add(e, f"s{i}", sched=T0 + (10 - i) * SEC, now=T0)
    rows, total = browse.line_page(queue, browse.SCHEDULED, 1, 2, T0)
    assert total == 5 and [r["id"] for r in rows] == scheduled_ids(e)[1:3]


def test_page_bounds():
    assert browse.page_bounds(1, 50) == (0, 50)
    assert browse.page_bounds(3, 10_000) == (2 * browse.MAX_LIMIT, browse.MAX_LIMIT)
    for page, per_page in ((0, 10), (1, 0), (browse.MAX_OFFSET // 10 + 1, 10)):
        with pytest.raises(ValueError):
            browse.page_bounds(page, per_page)


def test_oldest_ready_across_priorities(e):
    queue_of = lambda: e.inner.queues["q"]   # noqa: E731
    assert "q" not in e.inner.queues or browse.oldest_ready(queue_of()) is None
    add(e, "young-high", priority=9, now=T0 + 5 * SEC)
    add(e, "old-low", priority=1, now=T0 + SEC)
    add(e, "mid", priority=5, now=T0 + 3 * SEC)
    add(e, "later-low", priority=1, now=T0 + 4 * SEC)
    assert browse.oldest_ready(queue_of()) == T0 + SEC
    # looking at one priority only sees the highest
    assert browse.oldest_ready(queue_of(), groups=1) == T0 + 5 * SEC
    # a job back in line is ready since then
    assert browse.oldest_ready(queue_of(), {"old-low": T0 + 6 * SEC}) == T0 + 3 * SEC
    # a scheduled job is ready from its time
    other = Engine()
    add(other, "a", sched=T0 + 2 * SEC, now=T0)
    other.advance(T0 + 2 * SEC)
    assert browse.oldest_ready(other.inner.queues["q"]) == T0 + 2 * SEC


def test_one_priority_reads_the_first_job_only(e):
    for i, id in enumerate(ids(5)):
        add(e, id, now=T0 + i)
    assert browse.oldest_ready(e.inner.queues["q"]) == T0


def test_match_jobs_in_chunks(e):
    names = ids(50)
    for id in names:
        add(e, id, name="a" if int(id[1:]) % 2 else "b")
    for _ in range(20):
        lease(e, ("a",))
    jobs = e.inner.jobs
    yields = []
    rows = browse.match_jobs(jobs, list(jobs), browse.wanted("a", browse.LEASED), 3, 5, T0,
                             chunk=7, between=lambda: yields.append(1))
    leased_a = [id for id in jobs if jobs[id].name == "a" and jobs[id].state == J.LEASED]
    assert [r["id"] for r in rows] == leased_a[3:8]
    assert yields and len(yields) < 50 // 7 + 1   # stopped once the page was full
    # every chunk but the last yields
    calls = []
    browse.match_jobs(jobs, list(jobs), browse.wanted("nothing", browse.LEASED), 0, 5, T0, chunk=10,
                      between=lambda: calls.append(1))
    assert len(calls) == 4
    # a job gone between chunks is passed over
    listed = list(jobs)
    e.execute("delete", (leased_a[0],), T0)
    rows = browse.match_jobs(jobs, listed, browse.wanted("a", browse.LEASED), 0, 100, T0)
    assert len(rows) == 19


def test_find_number_and_count_states(e):
    for id in ids(10):
        add(e, id)
    jobs = e.inner.jobs
    target = jobs["j0007"]
    assert browse.find_number(jobs, list(jobs), target.number, chunk=3) is target
    assert browse.find_number(jobs, list(jobs), 10_000) is None
    assert e.inner.by_number is None   # no index was built for it
    lease(e)
    complete(e, leased_id(lease(e)))
    counts = {}
    browse.count_states(jobs.values(), counts)
    assert counts == {"q": [1, 1]}
    depth = browse.queue_depth(e.inner.queues["q"], leased=1)
    assert depth["ready"] == 8 and depth["leased"] == 1 and depth["finished"] == 1


def test_release_puts_a_leased_job_back_and_replays():
    e = Engine()
    add(e, "a", ttr=5_000)
    lease(e, now=T0 + SEC)
    job = e.inner.jobs["a"]
    fx = browse.console_step(e.inner, browse.release_events(job, T0 + 2 * SEC), T0 + 2 * SEC)
    assert fx.events == [("release", "a", T0 + 2 * SEC)]
    assert browse.state_of(job) == browse.READY and job.attempts == 1 and job.timer is None
    with pytest.raises(ValueError):
        browse.release_events(job, T0)
    replayed = PureEngine()
    replayed.replay(e.events + fx.events)
    assert browse.state_of(replayed.jobs["a"]) == browse.READY


def test_requeue_makes_a_failed_job_new_at_its_place_and_replays():
    e = Engine()
    add(e, "first", max_attempts=1, now=T0)
    add(e, "second", now=T0 + 1)
    assert leased_id(lease(e, now=T0 + SEC)) == "first"
    fail(e, "first", now=T0 + 2 * SEC)
    job = e.inner.jobs["first"]
    assert job.state == J.FAILED
    number = job.number
    fx = browse.console_step(e.inner, browse.requeue_events(job), T0 + 3 * SEC)
    again = e.inner.jobs["first"]
    assert again.state == J.PENDING and again.attempts == 0 and again.fails == 0
    assert again.result is None and again.number == number
    assert ready_ids(e) == ["first", "second"]   # its old place, ahead of the later job
    assert leased_id(lease(e, now=T0 + 4 * SEC)) == "first"   # its attempt is not used up
    with pytest.raises(ValueError):
        browse.requeue_events(e.inner.jobs["second"])
    replayed = PureEngine()
    replayed.replay(e.events[:-1] + fx.events)   # the log, up to the lease after the requeue
    assert replayed.jobs["first"].state == J.PENDING and replayed.queues["q"].jobs == 2


def test_requeued_job_goes_to_a_parked_lessee():
    e = Engine()
    add(e, "a", max_attempts=1)
    lease(e, now=T0 + SEC)
    fail(e, "a", now=T0 + 2 * SEC)
    assert lease(e, timeout=10_000, now=T0 + 3 * SEC, token="waiter") is None
    fx = browse.console_step(e.inner, browse.requeue_events(e.inner.jobs["a"]), T0 + 4 * SEC)
    assert [token for token, _ in fx.later] == ["waiter"]
    assert e.inner.jobs["a"].state == J.LEASED


def test_time_left_is_relative_to_now(e):
    add(e, "t", ttl=10_000, ttr=3_000, now=T0)
    lease(e, now=T0 + SEC)
    row = browse.job_row(e.inner.jobs["t"], T0 + 2 * SEC)
    assert row["ttr_left"] == 2 * SEC and row["ttl_left"] == 8 * SEC
    assert row["age"] == 2 * SEC and MS == 1000
