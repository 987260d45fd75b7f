"""What routers and shards share to reach a shard: the link to one
(:mod:`.shardlink`), where a replicated shard's primary serves
(:mod:`.primaries`), which shard serves each slot of a cluster
(:mod:`.slotmap`), which shard holds a job (:mod:`.directory`), and who a
client connection is, as its description travels over a link
(:mod:`.clients`).

Routers ask shards, and a shard asks the others (its id homes, a cluster's
moves), so both sit above this package and neither imports the other.
"""
