"""The ``queueserver cluster`` command line (its arguments only).

Kept apart from :mod:`.command` so that building the whole command line,
as every ``queueserver serve`` does before it binds its ports, loads no
cluster code: the cluster file's parser and the links come with the command.
"""
from __future__ import annotations

import argparse
from typing import Any, Protocol

DEFAULT_BATCH = 512   # slots per move step: a move pauses its slots for one round of steps


class Subcommands(Protocol):
    """Where subcommands are added (``ArgumentParser.add_subparsers()``)."""

    def add_parser(self, name: str, **kwargs: Any) -> argparse.ArgumentParser: ...


def add_parser(sub: Subcommands) -> None:
    p = sub.add_parser("cluster", help="show and move a cluster's slots",
                       description="Show which shard serves which slots, and move slots (with their "
                                   "jobs) between shards while traffic goes on.")
    p.add_argument("action", choices=("status", "rebalance", "add-node", "remove-node", "move", "resume"),
                   help="status: each shard's slots, jobs and moves under way; with replicas, each "
                        "shard's followers (in-sync or catching up, and how many events behind) and "
                        "a warning when fewer are in sync than the cluster file asks; on etcd, each "
                        "node's lease, each shard group's primary and epoch, and whether etcd's slot "
                        "map agrees (exit status 1 when a shard is down). rebalance: spread the slots "
                        "evenly. add-node/remove-node NAME: give a node its share, or move its slots "
                        "away. move: --slots to --to. resume: finish the moves a command that died "
                        "left (etcd's plan; without etcd, the moves a giver's log shows under way)")
    p.add_argument("node", nargs="?", metavar="NAME", help="the node to add or remove")
    p.add_argument("--cluster", required=True, metavar="FILE", help="the cluster file")
    p.add_argument("--slots", metavar="LIST", help="move: slots such as 0-99,512")
    p.add_argument("--to", metavar="SHARD", help="move: the shard to move them to (node/index)")
    p.add_argument("--batch", type=int, default=DEFAULT_BATCH, metavar="N",
                   help=f"slots per move step (default {DEFAULT_BATCH})")
    p.add_argument("--json", action="store_true", help="status: print JSON")
    p.add_argument("--lease", metavar="ID", help="resume: the etcd lease (hex) on which the node's "
                                                 "supervisor that started this resume took the moves' driver key")
