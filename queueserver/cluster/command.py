"""``queueserver cluster``: look at a cluster's slots and move them.

    queueserver cluster status --cluster FILE
    queueserver cluster rebalance --cluster FILE
    queueserver cluster add-node NAME --cluster FILE
    queueserver cluster remove-node NAME --cluster FILE
    queueserver cluster move --cluster FILE --slots 0-99,512 --to a/1
    queueserver cluster resume --cluster FILE

Every command first finishes any move left half done (a node killed
mid-move), and can itself be interrupted and run again. On a cluster with
``[etcd]``, a command writes its plan there first and drives it on a lease
(:mod:`.intents`); a plan whose driver died is resumed by a node's
supervisor (:mod:`.resumer`) with ``resume``, which also works by hand, and
no other command starts while a plan is left.
"""
from __future__ import annotations

import argparse
import json
import logging
import sys
from typing import TYPE_CHECKING, Any, Callable, Dict, List, Optional

from .clusterfile import ClusterError, ClusterSpec, load_cluster

if TYPE_CHECKING:   # imported when run: the links need gevent
    from .intents import Driver, Intents
    from .rebalance import Rebalancer
    from .moves import PlannedMove, SlotsAnswer

SLOTS = 16384         # (placement.py's; kept here so that the command line loads without xxhash)


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
    from ..lifecycle import die_with_supervisor, setup_logging
    from ..net.linkauth import SecretError, TLSConfigError
    from .admin import AdminError, Cluster
    from .coordination import CoordinationError
    from .intents import BadIntent, Superseded
    from .rebalance import Rebalancer
    say: Callable[[str], None] = lambda line: print(line, flush=True)
    if args.lease is not None:   # started by a node's supervisor: its log's lines, and its life
        die_with_supervisor()
        setup_logging("info", "cluster-resume")
        say = logging.getLogger("queueserver.cluster").info
    try:
        spec = load_cluster(args.cluster)
        if args.action in ("add-node", "remove-node"):
            if not args.node:
                raise ClusterError(f"{args.action} needs the node's NAME")
            spec.node(args.node)
        if args.lease is not None and (args.action != "resume" or spec.etcd is None):
            raise ClusterError("--lease goes with resume, on a cluster with [etcd]")
        try:
            lease = None if args.lease is None else int(args.lease, 16)
        except ValueError:
            raise ClusterError(f"--lease: {args.lease!r} is not an etcd lease id (hexadecimal)") from None
        cluster = Cluster(spec)
    except (ClusterError, SecretError, TLSConfigError) as err:
        print(f"queueserver cluster: {err}", file=sys.stderr)
        return 2
    rebalancer = Rebalancer(cluster, say=say)
    try:
        if args.action == "status":
            return _status(spec, rebalancer, args.json)
        return _act(args, spec, rebalancer) if spec.etcd is None else _drive(args, spec, rebalancer, lease)
    except ClusterError as err:
        print(f"queueserver cluster: {err}", file=sys.stderr)
        return 2
    except AdminError as err:
        print(f"queueserver cluster: {err}; run the command again once it is back", file=sys.stderr)
        return 1
    except (Superseded, BadIntent) as err:
        print(f"queueserver cluster: {err}", file=sys.stderr)
        return 1
    except CoordinationError as err:
        print(f"queueserver cluster: etcd: {err}; what is left of the moves is resumed once etcd "
              f"answers", file=sys.stderr)
        return 1
    finally:
        cluster.close()


def _drive(args: argparse.Namespace, spec: ClusterSpec, rebalancer: "Rebalancer", adopted: Optional[int]) -> int:
    """A command on a cluster with etcd: as the moves' one driver, on a lease
    (see :mod:`.intents`); refused while another drives or a plan is left.
    ``adopted``: the lease on which a node's supervisor took the driver key
    for this resume."""
    from .admin import AdminError
    from .coordination import Etcd, HeldLease
    from .intents import Driver, read
    assert spec.etcd is not None
    etcd = Etcd(spec.etcd)
    lease: Optional[HeldLease] = None
    try:
        if adopted is not None:
            driver = Driver.adopt(etcd, adopted, spec.founders())
        else:
            lease = HeldLease(etcd)
            taken = Driver.take(etcd, lease.id, args.action, None, spec.founders())
            if taken is None:
                raise ClusterError(f"refused: {read(etcd).describe()}; wait until it is done "
                                   f"(`queueserver cluster status` shows it)")
            driver = taken
        intents = read(etcd)
        if intents.plan is not None and args.action != "resume":
            raise ClusterError(f"refused: {intents.describe()}; no other move starts until it is done "
                               f"(`queueserver cluster resume` finishes it now)")
        rebalancer.journal = driver
        try:
            return _act(args, spec, rebalancer, driver, intents)
        except AdminError as err:
            if driver.plan is None:
                raise
            print(f"queueserver cluster: {err}; the plan stays in etcd: a node's supervisor resumes it "
                  f"once the shard answers", file=sys.stderr)
            return 1
    finally:
        if lease is not None:
            lease.revoke()   # the driver key goes with it
        etcd.close()


def _act(args: argparse.Namespace, spec: ClusterSpec, rebalancer: "Rebalancer",
         driver: Optional["Driver"] = None, intents: Optional["Intents"] = None) -> int:
    if args.action == "resume":
        return _resume(spec, rebalancer, driver, intents)
    if args.action == "move" and (not args.slots or not args.to):
        raise ClusterError("move needs --slots and --to")
    wanted = (parse_slots(args.slots), _shard(spec, args.to)) if args.action == "move" else None
    rebalancer.prepare()
    live = [s.ordinal for s in spec.shards()
            if s.node not in {n.name for n in spec.nodes if n.removed}]
    moves: List["PlannedMove"]
    if wanted is not None:
        moves = rebalancer.plan_move(*wanted, args.batch)
    elif args.action == "remove-node":
        among = [o for o in live if o not in {s.ordinal for s in spec.shards_of(args.node)}]
        if not among:
            raise ClusterError("cannot remove the last node")
        moves = rebalancer.plan_balance(among, args.batch)
    else:   # rebalance, add-node
        moves = rebalancer.plan_balance(live, args.batch)
    if driver is not None and moves:
        driver.begin(args.action, {"node": args.node, "slots": args.slots, "to": args.to, "batch": args.batch},
                     moves)
    slots, jobs = rebalancer.run(moves)
    if driver is not None and moves:
        driver.end()
    _done(spec, args.action, args.node, slots, jobs, len(live))
    return 0


def _done(spec: ClusterSpec, action: str, node: Optional[str], slots: int, jobs: int, shards: int) -> None:
    if action == "move":
        print(f"done: {jobs} jobs moved", flush=True)
    elif action == "remove-node":
        print(f"done: {slots} slots moved off node {node}; mark it `removed = true` in every "
              f"copy of {spec.path}, then stop it", flush=True)
    else:
        print(f"done: {slots} slots moved; {shards} shards serve {SLOTS // shards}-"
              f"{-(-SLOTS // shards)} slots each", flush=True)


def _resume(spec: ClusterSpec, rebalancer: "Rebalancer", driver: Optional["Driver"],
            intents: Optional["Intents"]) -> int:
    """Finish what a command that died left: without etcd, the moves the
    givers' logs show under way; with it, also the rest of its plan."""
    if driver is None or intents is None:
        rebalancer.prepare()
        print("done: every move a giver's log showed under way is finished", flush=True)
        return 0
    if intents.plan is None and not intents.under_way:
        rebalancer.prepare()
        print("done: nothing to resume (etcd holds no plan of moves)", flush=True)
        return 0
    driver.plan = intents.plan
    rebalancer.say(f"resuming {intents.what()}")
    rebalancer.prepare()
    slots, jobs = rebalancer.resume(intents.left(), {e: m["step"] for e, m in intents.under_way.items()})
    driver.end()
    plan = intents.plan
    if plan is None:
        print(f"done: {slots} slots moved", flush=True)
    else:
        live = [n for n in spec.nodes if not n.removed and n.name != plan["args"].get("node")]
        _done(spec, plan["command"], plan["args"].get("node"), slots, jobs,
              sum(n.shards for n in live) if plan["command"] == "remove-node" else
              sum(n.shards for n in spec.nodes if not n.removed))
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


def _in_etcd(spec: ClusterSpec, served: Dict[int, int]) -> List[str]:
    """Lines on what etcd holds of the moves: the slot map against what the
    shards serve (``served``: slot -> shard, of the shards that answered), and
    a plan left or under way; none without etcd."""
    if spec.etcd is None:
        return []
    from . import slotstore
    from .coordination import CoordinationError, Etcd
    from .intents import BadIntent, read
    etcd = Etcd(spec.etcd)
    try:
        table, _ = slotstore.read(etcd)
        intents = read(etcd)
    except (CoordinationError, BadIntent, ValueError) as err:
        return [f"etcd: {err}"]
    finally:
        etcd.close()
    names = {s.ordinal: s.name for s in spec.shards()}
    lines = [] if intents.plan is None and not intents.under_way else [f"moves: {intents.describe()}"]
    if table is None:
        return lines + ["slot map in etcd: none yet (a node writes it as it starts)"]
    runs: List[List[int]] = []   # [start, end, etcd's owner, the serving shard]
    for slot, serving in sorted(served.items()):
        owner = table.owners[slot]
        if owner == serving:
            continue
        if runs and runs[-1][1] == slot and runs[-1][2:] == [owner, serving]:
            runs[-1][1] = slot + 1
        else:
            runs.append([slot, slot + 1, owner, serving])
    if not runs:
        return lines + ["slot map in etcd: agrees"]
    return lines + [f"slot map in etcd: slots {start}-{end - 1} are shard {names.get(owner, owner)}'s there, "
                    f"shard {names[serving]} serves them" for start, end, owner, serving in runs]


def _status(spec: ClusterSpec, rebalancer: "Rebalancer", as_json: bool) -> int:
    from .admin import AdminError
    liveness = _liveness(spec)
    rows: List[Dict[str, Any]] = []
    served: Dict[int, int] = {}
    for shard in spec.shards():
        try:
            state: "SlotsAnswer" = rebalancer.cluster.call(shard.ordinal, "slots", [], wait=3.0)
        except AdminError as err:
            rows.append({"shard": shard.name, "ordinal": shard.ordinal, "up": False, "error": str(err)})
            continue
        served.update((slot, shard.ordinal) for start, end, _ in state["served"] for slot in range(start, end))
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
    for line in _in_etcd(spec, served):
        print(line)
    return 0 if all(row["up"] for row in rows) else 1
