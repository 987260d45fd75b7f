"""Socket plumbing shared by the router and the shards: batched writes and
msgpack frame channels."""
