"""``queueserver cluster``: look at a cluster's slots and move them.

    queueserver cluster status --cluster FILE
    queueserver cluster rebalance --cluster FILE
    queueserver cluster add-node NAME --cluster FILE
    queueserver cluster remove-node NAME --cluster FILE
    queueserver cluster move --cluster FILE --slots 0-99,512 --to a/1

Every command first finishes any move left half done (a node killed
mid-move), and can itself be interrupted and run again.
"""
from __future__ import annotations

import argparse
import json
import sys
from typing import TYPE_CHECKING, Any, Dict, List, Optional, Protocol

from .clusterfile import ClusterError, ClusterSpec, load_cluster

if TYPE_CHECKING:   # imported when run: the links need gevent
    from .rebalance import Rebalancer
    from .slots import SlotsAnswer

SLOTS = 16384         # (slots.py's; kept here so that the command line loads without xxhash)
DEFAULT_BATCH = 512   # slots per move step (rebalance.py's; the parser needs it without gevent)


class Subcommands(Protocol):
    """Where subcommands are added (``ArgumentParser.add_subparsers()``)."""

    def add_parser(self, name: str, **kwargs: Any) -> argparse.ArgumentParser: ...


def add_parser(sub: Subcommands) -> None:
    p = sub.add_parser("cluster", help="show and move a cluster's slots",
                       description="Show which shard serves which slots, and move slots (with their "
                                   "jobs) between shards while traffic goes on.")
    p.add_argument("action", choices=("status", "rebalance", "add-node", "remove-node", "move"))
    p.add_argument("node", nargs="?", metavar="NAME", help="the node to add or remove")
    p.add_argument("--cluster", required=True, metavar="FILE", help="the cluster file")
    p.add_argument("--slots", metavar="LIST", help="move: slots such as 0-99,512")
    p.add_argument("--to", metavar="SHARD", help="move: the shard to move them to (node/index)")
    p.add_argument("--batch", type=int, default=DEFAULT_BATCH, metavar="N",
                   help=f"slots per move step (default {DEFAULT_BATCH})")
    p.add_argument("--json", action="store_true", help="status: print JSON")


def parse_slots(text: str) -> List[int]:
    slots: List[int] = []
    for part in text.split(","):
        start, _, end = part.strip().partition("-")
        try:
            first, last = int(start), int(end or start)
        except ValueError:
            raise ClusterError(f"--slots: {part!r} is not a slot or a range like 0-99") from None
        if not 0 <= first <= last < SLOTS:
            raise ClusterError(f"--slots: {part!r} is outside 0-{SLOTS - 1}")
        slots.extend(range(first, last + 1))
    return slots


def _shard(spec: ClusterSpec, name: str) -> int:
    for shard in spec.shards():
        if shard.name == name:
            return shard.ordinal
    raise ClusterError(f"--to: no shard {name!r} in {spec.path} (shards are named node/index, e.g. "
                       f"{spec.shards()[0].name})")


def run(args: argparse.Namespace) -> int:
    # The links need gevent: imported here, so that the command line (and
    # ``--help``) loads without it.
    from ..net.linkauth import SecretError, TLSConfigError
    from .admin import AdminError, Cluster
    from .rebalance import Rebalancer
    try:
        spec = load_cluster(args.cluster)
        if args.action in ("add-node", "remove-node"):
            if not args.node:
                raise ClusterError(f"{args.action} needs the node's NAME")
            spec.node(args.node)
        cluster = Cluster(spec)
    except (ClusterError, SecretError, TLSConfigError) as err:
        print(f"queueserver cluster: {err}", file=sys.stderr)
        return 2
    rebalancer = Rebalancer(cluster, say=lambda line: print(line, flush=True))
    try:
        return _act(args, spec, rebalancer)
    except ClusterError as err:
        print(f"queueserver cluster: {err}", file=sys.stderr)
        return 2
    except AdminError as err:
        print(f"queueserver cluster: {err}; run the command again once it is back", file=sys.stderr)
        return 1
    finally:
        cluster.close()


def _act(args: argparse.Namespace, spec: ClusterSpec, rebalancer: "Rebalancer") -> int:
    live = [s.ordinal for s in spec.shards()
            if s.node not in {n.name for n in spec.nodes if n.removed}]
    if args.action == "status":
        return _status(spec, rebalancer, args.json)
    if args.action == "move":
        if not args.slots or not args.to:
            raise ClusterError("move needs --slots and --to")
        jobs = rebalancer.move(parse_slots(args.slots), _shard(spec, args.to), args.batch)
        print(f"done: {jobs} jobs moved")
        return 0
    if args.action == "remove-node":
        among = [o for o in live if o not in {s.ordinal for s in spec.shards_of(args.node)}]
        if not among:
            raise ClusterError("cannot remove the last node")
        moved = rebalancer.balance(among, args.batch)
        print(f"done: {moved} slots moved off node {args.node}; mark it `removed = true` in every "
              f"copy of {spec.path}, then stop it")
        return 0
    moved = rebalancer.balance(live, args.batch)   # rebalance, add-node
    print(f"done: {moved} slots moved; {len(live)} shards serve {SLOTS // len(live)}-"
          f"{-(-SLOTS // len(live))} slots each")
    return 0


def _liveness(spec: ClusterSpec) -> Optional[Dict[str, str]]:
    """Each node's liveness as etcd says it ("alive": its lease holds;
    "lapsed": no lease; "unknown": etcd did not answer); None without etcd."""
    if spec.etcd is None:
        return None
    from .coordination import CoordinationError, Etcd, live_nodes
    etcd = Etcd(spec.etcd)
    try:
        alive = live_nodes(etcd)
    except CoordinationError as err:
        print(f"etcd: {err}", file=sys.stderr)
        return {node.name: "unknown" for node in spec.nodes}
    finally:
        etcd.close()
    return {node.name: "alive" if node.name in alive else "lapsed" for node in spec.nodes}


def _groups(spec: ClusterSpec) -> Dict[int, Any]:
    """Each shard group's record in etcd (a replicated cluster on etcd; else none)."""
    if spec.etcd is None or not spec.replicas:
        return {}
    from .coordination import CoordinationError, Etcd
    from .groups import read_all
    etcd = Etcd(spec.etcd)
    try:
        return dict(read_all(etcd))
    except CoordinationError as err:
        print(f"etcd: {err}", file=sys.stderr)
        return {}
    finally:
        etcd.close()


def _status(spec: ClusterSpec, rebalancer: "Rebalancer", as_json: bool) -> int:
    from .admin import AdminError
    liveness = _liveness(spec)
    rows: List[Dict[str, Any]] = []
    for shard in spec.shards():
        try:
            state: "SlotsAnswer" = rebalancer.cluster.call(shard.ordinal, "slots", [], wait=3.0)
        except AdminError as err:
            rows.append({"shard": shard.name, "ordinal": shard.ordinal, "up": False, "error": str(err)})
            continue
        rows.append({"shard": shard.name, "ordinal": shard.ordinal, "up": True,
                     "slots": sum(end - start for start, end, _ in state["served"]),
                     "jobs": state["jobs"], "moving": state["moving"],
                     "followers": state.get("followers", [])})
    groups = _groups(spec)
    for shard, row in zip(spec.shards(), rows):
        row["node"] = shard.node
        if liveness is not None:
            row["etcd"] = liveness[shard.node]
        group = groups.get(shard.ordinal)
        if group is not None:   # a replicated cluster on etcd: where its primary is now
            row.update(primary=group["primary"], epoch=group["epoch"], in_sync=group["isr"])
    if as_json:
        print(json.dumps(rows))
        return 0
    for row in rows:
        lease = f"  etcd: {row['etcd']}" if "etcd" in row else ""
        if "primary" in row:
            lease += f"  primary on {row['primary']} (epoch {row['epoch']})"
        if not row["up"]:
            print(f"{row['shard']:>12}  DOWN  {row['error']}{lease}")
            continue
        moving = f"  moving: {row['moving']}" if row["moving"] else ""
        print(f"{row['shard']:>12}  {row['slots']:>6} slots  {row['jobs']:>9} jobs{lease}{moving}")
        for follower in row["followers"]:
            print(f"{'':>12}  follower on {follower['node']}: {follower['state']}, "
                  f"{follower['lag']} events behind")
        if spec.replicas and len([f for f in row["followers"] if f["state"] == "in-sync"]) < spec.replicas:
            print(f"{'':>12}  {spec.replicas} followers wanted: acknowledged jobs are on fewer hosts")
    return 0 if all(row["up"] for row in rows) else 1
