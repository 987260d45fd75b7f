"""What the console shows: plain typed records, the contract between
:mod:`.source` (which fills them from the shards) and :mod:`.app` (which
renders them as HTML and JSON). Times are in seconds (floats), ages and
times-left relative to the moment the source answered.
"""
from __future__ import annotations

from typing import Any, Dict, List, Optional, TypedDict

#: The states a queue's jobs are listed by.
STATES = ("ready", "scheduled", "leased", "finished")
#: The lists a queue's page offers: its states, and its failed jobs (the
#: finished ones whose outcome is failed: the dead jobs).
LISTS = STATES + ("failed",)
#: A finished job's outcomes.
OUTCOMES = ("completed", "failed")
#: Most jobs one page lists (a larger ``per_page`` is cut to this).
MAX_PER_PAGE = 100
#: Most connections and leases the workers page lists (all are counted).
MAX_LISTED = 500


class QueueRow(TypedDict):
    """One queue on the overview."""
    name: str
    node: str                 # the node whose shard holds it ("" on a single host)
    shard: int
    ready: int
    scheduled: int
    leased: int
    finished: int             # finished jobs kept with their results
    added_per_s: float
    completed_per_s: float
    failed_per_s: float
    oldest_ready_age_s: Optional[float]   # None: nothing ready
    protocols: List[str]      # protocols whose clients used it lately, e.g. ["workq", "goqueue"]


class JobRow(TypedDict):
    """One job in a queue's list."""
    id: str                   # the job's id (UUID for workq/taskflux/..., as the engine keeps it)
    number: Optional[int]     # its goqueue/takeanumber number, if it has one
    queue: str
    state: str                # one of STATES
    priority: int
    attempts: int
    age_s: float
    ttr_left_s: Optional[float]   # leased jobs only
    ttl_left_s: Optional[float]   # None: no TTL
    outcome: Optional[str]    # a finished job's: "completed" or "failed" (None: not finished)
    error: Optional[str]      # a failed job's result (its first 200 bytes, as text), None if it left none


class Filters(TypedDict, total=False):
    """What a list of jobs is narrowed by (a key left out: not asked)."""
    outcome: str              # "completed" or "failed" (finished jobs)
    min_age_s: float          # made at least this long ago
    max_age_s: float          # made at most this long ago
    priority: int             # exactly
    text: str                 # in the payload, or in a failed job's error


class JobPage(TypedDict):
    """A page of one queue's jobs (or, queue None, every queue's) in one of :data:`LISTS`."""
    queue: Optional[str]
    state: str
    page: int                 # 1-based
    pages: int
    per_page: int
    total: int
    jobs: List[JobRow]


class Lease(TypedDict):
    """Who holds a leased job (known on every path, with the job history off too)."""
    connection: str           # the client's address as the router saw it, e.g. "127.0.0.1:53312" ("": unknown)
    protocol: str             # "": unknown
    ttr_left_s: float
    client: str               # the connection as the job history names it, "<router>-<id>" ("": unknown)
    via: str                  # "router" (forwarded) or "direct" (served by the shard itself); "": unknown
    leased_s: Optional[float]     # how long ago the lease began (None: not known)
    connected_s: Optional[float]  # how long the client has been connected (None: not known)
    left_s: Optional[float]       # how long ago the client disconnected (None: connected, as far as known)


class JobDetail(TypedDict):
    """Everything the engine knows of one job, for its page."""
    job: JobRow
    node: str
    shard: int
    payload_size: int
    payload_text: Optional[str]   # the payload as text when it is valid UTF-8 (first 4 KiB)
    payload_hex: str              # the first 4 KiB as hex
    result: Optional[str]         # as text, or hex when not UTF-8; None: no result
    max_attempts: Optional[int]
    lease: Optional[Lease]
    history: List[str]            # the job's own history lines, oldest first (empty: history off)
    extra: Dict[str, Any]         # any other field the engine keeps (scheduled time, TTL, ...)


class SearchResult(TypedDict):
    """What the search box found: queues whose name contains the text, and the job it names."""
    queues: List[str]
    job: Optional[JobDetail]


class RatePoint(TypedDict):
    """A queue's (or the node's) rates over one interval, and the jobs it
    held at its end; None where a queue's values are not known (more queues
    were active than a point of the series keeps)."""
    t: float                  # unix time, end of the interval
    step: int                 # seconds per point of its resolution
    added: Optional[float]    # per second
    completed: Optional[float]
    failed: Optional[float]
    depth: Optional[float]    # jobs held
    ready: Optional[float]    # the node's jobs by state (None for a queue)
    scheduled: Optional[float]
    leased: Optional[float]
    finished: Optional[float]


class ShardView(TypedDict):
    shard: int
    name: str                 # e.g. "a/0" in a cluster, "0" on a single host
    up: bool
    jobs: int
    queues: int
    slots: str                # slot ranges, e.g. "0-8191"; "" on a single host
    role: str                 # "primary" (replicas later: "follower")
    lag: Optional[int]        # replica lag in records, once replicas exist


class NodeInfo(TypedDict):
    name: str
    host: str
    up: bool
    console: str              # the node's console URL ("" if unknown)
    shards: List[ShardView]


class LinkView(TypedDict):
    source: str
    target: str
    state: str                # "up", "down", ...


class ClusterView(TypedDict):
    """The cluster page: every node and shard, moves in progress, links."""
    clustered: bool
    nodes: List[NodeInfo]
    moves: List[Dict[str, Any]]
    links: List[LinkView]


class ActionResult(TypedDict):
    """The outcome of a delete, requeue, purge or bulk retry or delete."""
    ok: bool
    message: str              # e.g. "deleted job 7f3c..." or "purged 120 jobs from emails"
    count: int                # jobs affected


class ConnectionRow(TypedDict):
    """A client connection of this node (workers, producers, anyone)."""
    router: str               # the router that accepted it
    connection: int           # its id at that router
    protocol: str
    address: str              # the client's host:port
    connected_s: Optional[float]   # how long it has been connected
    served_by: str            # "router" (forwarded) or "shard <n>" (the direct path)
    leases: int               # jobs it holds leased on this node's shards


class LeaseRow(TypedDict):
    """A leased job and who holds it."""
    job: JobRow
    shard: int
    leased_s: Optional[float]
    holder: Optional[Dict[str, Any]]   # address, protocol, client, via, left_s (None: not known)


class ProcessCount(TypedDict):
    """One router or shard on the workers page."""
    name: str                 # "router 0", "shard 1"
    up: bool
    connections: int          # a router: connections accepted and open; a shard: served directly
    leases: int               # a shard: jobs leased there (a router: 0)


class WorkersView(TypedDict):
    """Who is connected and who holds which lease, per router and shard."""
    connections: List[ConnectionRow]   # the first MAX_LISTED
    connections_total: int
    leases: List[LeaseRow]             # the first MAX_LISTED, longest held first
    leases_total: int
    leases_unknown: int                # leases whose holder is not known
    processes: List[ProcessCount]
