"""The web console: server-rendered pages on the node's HTTP port (beside
``/metrics`` and ``/status``) over the shards' own state, for operators.

:mod:`.model` is what the pages show (typed records), :mod:`.source` gathers
it from the shards (and, in a cluster, from the other nodes' consoles),
:mod:`.app` turns HTTP requests into pages and actions, and :mod:`.http`
is the node's HTTP port itself (the console, ``/metrics`` and ``/status``),
which the supervisor runs.
"""
