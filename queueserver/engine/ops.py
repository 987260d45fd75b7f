"""Every operation a shard serves, and every kind of state change, declared once.

What a request *means* beyond its handler is read in many places: the log
refuses the ones that change state while it cannot write, a connection
budgets the bytes of their answers and gives back the jobs they handed to
a client that left, a router says who is behind the ones the job history
names, a shard numbers the jobs some make and sends others to its id home
or its cluster shell. Each of those places reads it here (the sets below
are derived from :data:`OPS`), so adding a command touches its codec, this
table and its handler (``Engine.REQUESTS``); ``tests/test_ops_table.py``
checks that the three agree, from the codecs' own requests.

Events (:data:`EVENT_KINDS`) are declared the same way: what each state
change means for its job, which the job history (:mod:`queueserver.shard.outcomes`)
and the metrics (:mod:`queueserver.shard.stats`) read; each has its handler
in ``Engine.EVENTS``.

Each client's operation also names its *verb* (:data:`PRODUCE`,
:data:`CONSUME`, :data:`INSPECT`, :data:`ADMIN`): what an identity must be
allowed on the queue it names (or, for a job named by id or number, on the
job's queue) for it to run (:mod:`queueserver.access`).

Like Redis's ``commands.def``: one declaration each, flags that subsystems
read (and, like its ACL categories, a verb that the access rules read).
Plain data, compiled with the hot path: readers take the derived
module-level sets and dicts, as cheap as the sets they replace.
"""
from __future__ import annotations

from typing import Dict, Final, FrozenSet, NamedTuple, Optional, Tuple

# ------------------------------------------------------------------ flags
#: The engine serves it: ``Engine.REQUESTS`` has its handler.
ENGINE: Final = 1
#: The shard's id home answers it (:mod:`queueserver.shard.idhome`), not the engine.
ID_HOME: Final = 2
#: A cluster's slot operation: the shard's cluster shell serves it (never
#: answered ``MOVED``: it is about the slots themselves).
CLUSTER: Final = 4
#: A codec makes it from a client's request; the rest are the server's own
#: (give-backs, questions between shards, the ``cluster`` command).
FROM_CLIENT: Final = 8
#: It may change the shard's state (the engine may record events for it).
CHANGES: Final = 16
#: It makes a job, and so a job number; its id is claimed at its home.
NUMBERED: Final = 32
#: The job history names the client behind it (the adder, the worker,
#: whoever finishes a job): a router sends the client's description with it.
NAMES_CLIENT: Final = 64

# ---------------------------------------------------------- answer kinds
#: No payload: a status, an id, a count.
SMALL: Final = 0
#: May carry one job's payload or result.
PAYLOAD: Final = 1
#: Up to ``limit`` (the request's last argument) jobs, payloads included.
LISTING: Final = 2
#: Up to ``limit`` (the request's last argument) queues.
QUEUE_LISTING: Final = 3

# ------------------------------------------------------------- deliveries
#: Its answer hands no job over.
NO_DELIVERY: Final = 0
#: Hands a job over (a lease): delivered once the client's kernel has
#: acknowledged the answer's bytes; the job may be given back until then.
ACKNOWLEDGED: Final = 1
#: Hands a job over with no acknowledgement to come (a take, destructive):
#: delivered once its answer is written whole.
WRITTEN: Final = 2


# ------------------------------------------------------------------ verbs
#: Adds jobs.
PRODUCE: Final = "produce"
#: Takes work and tells its outcome: lease, take, complete, fail, retry, a
#: worker's finishing delete (takeanumber's DONE, goqueue's DELETE).
CONSUME: Final = "consume"
#: Reads: sizes, a job, its result, listings (and makes an empty queue: queued's USE).
INSPECT: Final = "inspect"
#: Removes what others put there: workq's delete by id (the console's actions too).
ADMIN: Final = "admin"
#: Every verb, in the order the access file and the docs list them.
ALL_VERBS: Final = (PRODUCE, CONSUME, INSPECT, ADMIN)


class Op(NamedTuple):
    """One operation's traits."""

    flags: int
    answer: int = SMALL
    #: the index of the argument whose bytes it brings in (a payload, a result); -1: none
    carries: int = -1
    delivery: int = NO_DELIVERY
    #: the request that gives back a job its answer delivered to a client that had left
    undo: Optional[str] = None
    #: what an identity must be allowed to do on its queue (a client's operation; "" for the server's own)
    verb: str = ""


_CLIENT_CHANGE: Final = FROM_CLIENT | ENGINE | CHANGES
_CLIENT_READ: Final = FROM_CLIENT | ENGINE
_SERVER_CHANGE: Final = ENGINE | CHANGES

#: Every operation, by the name it has in a :class:`~queueserver.protocols.base.Command`
#: and on a shard's link.
OPS: Final[Dict[str, Op]] = {
    # a job's life, as clients ask for it
    "add": Op(_CLIENT_CHANGE | NUMBERED | NAMES_CLIENT, carries=2, verb=PRODUCE),
    "run": Op(_CLIENT_CHANGE | NUMBERED | NAMES_CLIENT, PAYLOAD, carries=2, verb=PRODUCE),
    "lease": Op(_CLIENT_CHANGE | NAMES_CLIENT, PAYLOAD, delivery=ACKNOWLEDGED, undo="unlease",
                verb=CONSUME),
    "take": Op(_CLIENT_CHANGE | NAMES_CLIENT, PAYLOAD, delivery=WRITTEN, undo="restore", verb=CONSUME),
    "complete": Op(_CLIENT_CHANGE | NAMES_CLIENT, carries=1, verb=CONSUME),
    "fail": Op(_CLIENT_CHANGE | NAMES_CLIENT, carries=1, verb=CONSUME),
    "retry": Op(_CLIENT_CHANGE | NAMES_CLIENT, verb=CONSUME),
    "delete": Op(_CLIENT_CHANGE | NAMES_CLIENT, verb=ADMIN),
    # takeanumber's DONE: how its worker finishes a reserved job (a delete naming the queue)
    "done": Op(_CLIENT_CHANGE | NAMES_CLIENT, verb=CONSUME),
    # goqueue's DELETE: how its worker finishes a reserved job
    "delete_number": Op(_CLIENT_CHANGE | NAMES_CLIENT, verb=CONSUME),
    # queued's USE, TaskFlux's create: an empty queue, no job changed; every queued
    # client USEs its queue first, so the harmless verb its producers and consumers can both hold
    "create_queue": Op(_CLIENT_CHANGE, verb=INSPECT),
    # what clients read
    "result": Op(_CLIENT_READ, PAYLOAD, verb=INSPECT),
    "size": Op(_CLIENT_READ, verb=INSPECT),
    "has": Op(_CLIENT_READ, verb=INSPECT),
    "inspect_job": Op(_CLIENT_READ, PAYLOAD, verb=INSPECT),
    "inspect_jobs": Op(_CLIENT_READ, LISTING, verb=INSPECT),
    "inspect_scheduled": Op(_CLIENT_READ, LISTING, verb=INSPECT),
    "inspect_queue": Op(_CLIENT_READ, verb=INSPECT),
    "inspect_queues": Op(_CLIENT_READ, QUEUE_LISTING, verb=INSPECT),
    "inspect_server": Op(_CLIENT_READ, verb=INSPECT),
    # the server's own: give-backs and ends of what a client left (never
    # refused: they undo), a refused id, and another shard's question
    "unlease": Op(_SERVER_CHANGE),
    "restore": Op(_SERVER_CHANGE),
    "cancel": Op(_SERVER_CHANGE),
    "disown": Op(_SERVER_CHANGE),
    "withdraw_new": Op(_SERVER_CHANGE),
    "exists": Op(ENGINE),
    # the queue of a job named by id or number: what a router checks an identity's permission on
    "queue_of": Op(ENGINE),
    # a cluster's slots: the shard's first ones, the ``cluster`` command's moves
    "claim": Op(_SERVER_CHANGE),
    "move_out": Op(_SERVER_CHANGE | CLUSTER),
    "move_in": Op(_SERVER_CHANGE | CLUSTER),
    "move_done": Op(_SERVER_CHANGE | CLUSTER),
    "slots": Op(CLUSTER),
    # the job ids homed at a shard (:mod:`queueserver.shard.idhome`)
    "claims": Op(ID_HOME),
    "register": Op(ID_HOME),
    "locate": Op(ID_HOME),
    "homed": Op(ID_HOME),
}


def _having(flags: int, without: int = 0) -> FrozenSet[str]:
    return frozenset(name for name, op in OPS.items() if op.flags & flags == flags and not op.flags & without)


#: Refused while the shard's log cannot write: a client's request that would
#: change state could not be made durable (the server's own give-backs undo,
#: and are never refused).
REFUSED_WHILE_LOG_FAILS: Final = _having(FROM_CLIENT | CHANGES)
#: Requests that make a job (and so a job number).
MAKES_JOBS: Final = _having(NUMBERED)
#: Requests whose client the job history names.
HISTORY_NAMES_CLIENT: Final = _having(NAMES_CLIENT)
#: Requests the shard's id home answers.
ID_HOME_OPS: Final = _having(ID_HOME)
#: Requests the shard's cluster shell serves.
CLUSTER_OPS: Final = _having(CLUSTER)
#: Requests whose answer may hand a job over (given back unless delivered).
DELIVERIES: Final = frozenset(name for name, op in OPS.items() if op.delivery != NO_DELIVERY)
#: Of those, the ones delivered once written (destructive: nothing to run out).
DELIVERED_WHEN_WRITTEN: Final = frozenset(name for name, op in OPS.items() if op.delivery == WRITTEN)
#: Delivering request -> the request that gives its job back.
UNDOES: Final[Dict[str, str]] = {name: op.undo for name, op in OPS.items() if op.undo is not None}
#: Client's request -> its verb (what the access rules check; see :data:`ALL_VERBS`).
VERBS: Final[Dict[str, str]] = {name: op.verb for name, op in OPS.items() if op.flags & FROM_CLIENT}
#: Request -> ``(carries, answer)``: what a connection budgets for it in flight.
BUDGETS: Final[Dict[str, Tuple[int, int]]] = {name: (op.carries, op.answer) for name, op in OPS.items()
                                              if op.flags & FROM_CLIENT}


# ------------------------------------------------------------------ events
# What an event does to its job, as the metrics count it (one handler each
# in :class:`queueserver.shard.stats.ShardStats`).
#: Nothing counted: no job's step (a queue, the counters, a slot move), or
#: one that changes no count (a scheduled job waking).
UNCOUNTED: Final = 0
#: A job is added.
ADDS: Final = 1
#: A job is leased.
LEASES: Final = 2
#: A job is completed.
COMPLETES: Final = 3
#: A job's failure is told: its lease (if any) ends, timed; it goes back in line or fails.
FAILS: Final = 4
#: A job's lease ran out (untimed): it goes back in line, or fails with no attempts left.
RUNS_OUT: Final = 5
#: A job met at lease time with no attempts left fails.
EXHAUSTS: Final = 6
#: A job's time to live is over: it goes.
EXPIRES: Final = 7
#: A job leaves (deleted, or set aside for another shard); its lease, if any, ends with it.
REMOVES: Final = 8
#: A job is dequeued for good: leased and done at once.
TAKES: Final = 9
#: A take that was not delivered is undone.
RESTORES: Final = 10
#: A lease that was not delivered is undone.
UNLEASES: Final = 11
#: A job goes back in line from now (its holder left; a retry); its lease, if any, ends.
REQUEUES: Final = 12
#: A job comes as it is (a slot move), maybe leased.
ARRIVES: Final = 13


class EventKind(NamedTuple):
    """What one kind of event means for its job."""

    #: the history's step: when the job is unfinished after it, completed, failed (None: no step)
    history: Tuple[Optional[str], Optional[str], Optional[str]]
    #: what the metrics count (:data:`ADDS`, ...)
    counts: int = UNCOUNTED


def _always(step: Optional[str]) -> Tuple[Optional[str], Optional[str], Optional[str]]:
    return (step, step, step)


_NO_STEP: Final = _always(None)

#: Every kind of event ``Engine.apply`` carries out. A job that had finished
#: already makes no step when it is dropped (its first final step stays its
#: outcome); a ``complete`` that did not leave the job completed makes none.
EVENT_KINDS: Final[Dict[str, EventKind]] = {
    "add": EventKind(_always("added"), ADDS),
    "restore": EventKind(_always("returned"), RESTORES),
    "wake": EventKind(_NO_STEP),
    "lease": EventKind(_always("leased"), LEASES),
    "unlease": EventKind(_always("returned"), UNLEASES),
    "ttr": EventKind(("requeued", "requeued", "dead"), RUNS_OUT),
    "exhaust": EventKind(_always("dead"), EXHAUSTS),
    "complete": EventKind((None, "completed", None), COMPLETES),
    "fail": EventKind(("retried", "retried", "failed"), FAILS),
    "retry": EventKind(_always("retried"), REQUEUES),
    "delete": EventKind(("deleted", None, None), REMOVES),
    "ttl": EventKind(("expired", None, None), EXPIRES),
    "release": EventKind(_always("released"), REQUEUES),
    "take": EventKind(_always("taken"), TAKES),
    "job": EventKind(_NO_STEP, ARRIVES),
    "queue": EventKind(_NO_STEP),
    "counters": EventKind(_NO_STEP),
    "own": EventKind(_NO_STEP),
    "moving": EventKind(_NO_STEP),
    "export": EventKind(_NO_STEP, REMOVES),
    "exported": EventKind(_NO_STEP),
    "gave": EventKind(_NO_STEP),
    "hints": EventKind(_NO_STEP),
}

#: Event kind -> its history steps (see :attr:`EventKind.history`), for the kinds that make any.
HISTORY_STEPS: Final[Dict[str, Tuple[Optional[str], Optional[str], Optional[str]]]] = {
    kind: event.history for kind, event in EVENT_KINDS.items() if event.history != _NO_STEP}
#: Event kind -> what the metrics count, for the kinds they count.
COUNTS: Final[Dict[str, int]] = {kind: event.counts for kind, event in EVENT_KINDS.items()
                                 if event.counts != UNCOUNTED}
