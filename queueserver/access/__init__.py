"""Who may talk to the server, and what each may do: the access file.

One TOML file names *identities*, how each is recognised (its TLS
certificate's names, or the networks its plain connections come from), and
per identity the queue-name patterns it may ``produce`` to, ``consume``
from, ``inspect`` and ``admin``\\ ister (the verbs of
:data:`queueserver.engine.ops.ALL_VERBS`; each operation declares its own in
:data:`queueserver.engine.ops.OPS`). The model is Redis's ACL (users, key
patterns, command categories), Kafka's (a principal, a resource pattern, an
operation) and NATS's allow lists per subject, reduced to what a job queue
needs: no deny rules, no ordering, one glob list per verb.

Pure: :func:`load` reads a file's text and :func:`parse` turns it into
:class:`AccessRules`; nothing here touches a socket. The server's shells
resolve a connection's identity once, at connect (:meth:`AccessRules.resolve`),
and check each request against the identity's :class:`Permissions`.
"""
from .rules import (JOB_QUEUE, AccessControl, AccessError, AccessRules, Identity, Matcher, Permissions, load, parse)

__all__ = ["JOB_QUEUE", "AccessControl", "AccessError", "AccessRules", "Identity", "Matcher", "Permissions", "load", "parse"]
