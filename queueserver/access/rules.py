"""The access file, parsed and compiled: identities, how each is recognised,
and what each may do.

The file (TOML)::

    [identities.ingest]                 # a name of your choosing
    networks = ["10.1.0.0/16"]          # plain connections from here are it
    certificates = ["ingest.example"]   # TLS clients whose certificate names it
    produce = ["orders.*", "mail"]      # glob patterns (fnmatchcase) per verb
    inspect = ["orders.*"]

    [identities.workers]
    networks = ["10.2.0.0/16"]
    consume = ["orders.*"]

A verb left out allows nothing. Resolution (:meth:`AccessRules.resolve`):
a connection's certificate names first (its subject CN, then its SANs, as
the TLS layer gives them), then the longest network holding its address;
none matches: unknown (refused at connect). Each identity's patterns are
compiled once per verb into one regular expression whose answers are
cached per queue name, so a request's check is a dict lookup and, mostly,
another dict lookup.
"""
from __future__ import annotations

import fnmatch
import ipaddress
import re
import tomllib
from typing import Any, Dict, Final, List, Optional, Sequence, Tuple, Union

from ..engine.ops import ALL_VERBS, INSPECT, VERBS
from ..engine.status import FORBIDDEN, NOT_FOUND
from ..protocols.base import BY_ID, BY_NAME, BY_NAMES, BY_NUMBER, Command

Network = Union[ipaddress.IPv4Network, ipaddress.IPv6Network]

#: What :meth:`Permissions.refusal` says of a request naming a job by id or
#: number: it depends on the job's queue, which only its shard knows.
JOB_QUEUE: Final = "\0job's queue"
#: Queue names a matcher remembers its answer for before it starts afresh.
MAX_CACHED: Final = 65536
#: What an identity's name may be: it shows in logs and metric labels.
_NAME: Final = re.compile(r"[A-Za-z0-9_.@-]{1,64}")
_RECOGNISED_BY: Final = ("networks", "certificates")
_KEYS: Final = (*_RECOGNISED_BY, *ALL_VERBS)


class AccessError(ValueError):
    """The access file cannot be used: one line naming the file and the key."""


class Matcher:
    """Whether a queue name matches one of a verb's patterns (answers cached)."""

    __slots__ = ("patterns", "everything", "_regex", "_seen")

    def __init__(self, patterns: Sequence[str]) -> None:
        self.patterns = tuple(patterns)
        #: ``*`` is among them: every queue, and requests naming no queue (``inspect server``)
        self.everything = "*" in self.patterns
        self._regex = re.compile("|".join(fnmatch.translate(p) for p in self.patterns)) if self.patterns else None
        self._seen: Dict[str, bool] = {}

    def __call__(self, name: str) -> bool:
        seen = self._seen.get(name)
        if seen is not None:
            return seen
        allowed = self.everything or (self._regex is not None and self._regex.match(name) is not None)
        if len(self._seen) >= MAX_CACHED:
            self._seen.clear()
        self._seen[name] = allowed
        return allowed


class Permissions:
    """What one identity may do, one :class:`Matcher` per verb."""

    __slots__ = ("identity", "matchers")

    def __init__(self, identity: str, patterns: Dict[str, Sequence[str]]) -> None:
        self.identity = identity
        self.matchers: Dict[str, Matcher] = {verb: Matcher(patterns.get(verb, ())) for verb in ALL_VERBS}

    def take(self, other: "Permissions") -> None:
        """Take ``other``'s rules (a reload): every connection holding this
        object checks its next request against them."""
        self.matchers = other.matchers

    def may(self, verb: str, name: str) -> bool:
        return self.matchers[verb](name)

    def refusal(self, command: Command) -> Optional[str]:
        """Why ``command`` may not run (None: it may; :data:`JOB_QUEUE`: it
        names a job, whose queue decides: see :meth:`job_refusal`)."""
        op = command.op
        verb = VERBS.get(op) if op is not None else None
        if verb is None:
            return None   # no client's operation: the server answers it with an error anyway
        matcher = self.matchers[verb]
        if matcher.everything:
            return None
        route, key = command.route, command.key
        if route == BY_NAME:
            return None if matcher(key) else self.message(verb, key)
        if route == BY_NAMES:
            for name in key:
                if not matcher(name):
                    return self.message(verb, name)
            return None
        if route == BY_ID or route == BY_NUMBER:
            return JOB_QUEUE
        return self.message(verb, None)   # every shard's: it needs the verb on every queue ("*")

    def job_refusal(self, command: Command, queue: str) -> Optional[Tuple[int, str]]:
        """The reply refusing ``command``, whose job is in ``queue`` (None: it
        may run): a queue the identity may not even inspect is not shown, so
        its job is not found."""
        op = command.op
        verb = VERBS[op] if op is not None else INSPECT
        if self.matchers[verb](queue):
            return None
        if self.matchers[INSPECT](queue):
            return (FORBIDDEN, self.message(verb, queue))
        return (NOT_FOUND, "")

    def message(self, verb: str, queue: Optional[str]) -> str:
        where = f"queue {queue}" if queue is not None else "every queue"
        return f"Permission denied: {self.identity} may not {verb} {where}"


class Identity:
    """One identity of the file: its name, how it is recognised, its permissions."""

    __slots__ = ("name", "certificates", "networks", "permissions")

    def __init__(self, name: str, certificates: Sequence[str], networks: Sequence[Network],
                 patterns: Dict[str, Sequence[str]]) -> None:
        self.name = name
        self.certificates = tuple(certificates)
        self.networks = tuple(networks)
        self.permissions = Permissions(name, patterns)


class AccessRules:
    """Every identity of one access file, ready to resolve connections."""

    def __init__(self, path: str, identities: Sequence[Identity]) -> None:
        self.path = path
        self.identities: Dict[str, Identity] = {identity.name: identity for identity in identities}
        self._by_certificate = {name: identity for identity in identities for name in identity.certificates}
        #: longest prefix first: the most specific network wins
        self._networks: List[Tuple[Network, Identity]] = sorted(
            ((network, identity) for identity in identities for network in identity.networks),
            key=lambda entry: -entry[0].prefixlen)

    def resolve(self, certificate_names: Sequence[str], address: str) -> Optional[Identity]:
        """The identity of a connection: by its certificate's names, else by
        the longest network holding ``address`` (None: unknown)."""
        for name in certificate_names:
            identity = self._by_certificate.get(name)
            if identity is not None:
                return identity
        if not address or not self._networks:
            return None
        try:
            ip = ipaddress.ip_address(address.split("%", 1)[0])
        except ValueError:
            return None
        if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
            ip = ip.ipv4_mapped   # a dual-stack listener's IPv4 client
        for network, identity in self._networks:
            if ip.version == network.version and ip in network:
                return identity
        return None


class AccessControl:
    """The rules a process enforces now. Connections hold the
    :class:`Permissions` of their identity, one shared object per identity
    name, which :meth:`replace` updates in place: new rules apply to every
    connection's next request, with no list of connections to walk."""

    def __init__(self, rules: AccessRules) -> None:
        self.rules = rules
        self._live: Dict[str, Permissions] = {}

    @property
    def path(self) -> str:
        return self.rules.path

    def admit(self, certificate_names: Sequence[str], address: str) -> Optional[Permissions]:
        """The permissions of a new connection's identity (None: unknown)."""
        identity = self.rules.resolve(certificate_names, address)
        return None if identity is None else self.permissions(identity.name)

    def permissions(self, name: str) -> Permissions:
        """Identity ``name``'s live permissions (one it no longer names may do nothing)."""
        live = self._live.get(name)
        if live is None:
            identity = self.rules.identities.get(name)
            live = self._live[name] = identity.permissions if identity is not None else Permissions(name, {})
        return live

    def replace(self, rules: AccessRules) -> None:
        """Enforce ``rules`` from now on. A connection keeps the identity it
        was given at connect (what it is known by does not change while it
        is open); its identity's new permissions apply at once, and an
        identity the new rules do not name may do nothing."""
        self.rules = rules
        for name, live in self._live.items():
            identity = rules.identities.get(name)
            live.take(identity.permissions if identity is not None else Permissions(name, {}))


# ------------------------------------------------------------------ reading
def load(path: str) -> AccessRules:
    """Read and parse the access file at ``path``."""
    try:
        with open(path, "rb") as file:
            data = file.read()
    except OSError as err:
        raise AccessError(f"{path}: cannot read the access file: {err.strerror or err}") from None
    return parse(data.decode("utf-8", "replace"), path)


def parse(text: str, path: str = "<access file>") -> AccessRules:
    """The rules of an access file's ``text`` (``path`` names it in errors)."""
    try:
        document = tomllib.loads(text)
    except tomllib.TOMLDecodeError as err:
        raise AccessError(f"{path}: not valid TOML: {err}") from None
    for key in document:
        if key != "identities":
            raise AccessError(f"{path}: {key}: unknown key (the file holds [identities.<name>] tables)")
    tables = document.get("identities", {})
    if not isinstance(tables, dict) or not tables:
        raise AccessError(f"{path}: identities: no identity is defined ([identities.<name>] tables)")
    identities = [_identity(path, name, table) for name, table in tables.items()]
    _check_unique(path, identities)
    return AccessRules(path, identities)


def _identity(path: str, name: str, table: Any) -> Identity:
    where = f"identities.{name}"
    if not _NAME.fullmatch(name):
        raise AccessError(f"{path}: {where}: an identity's name is 1 to 64 of A-Z a-z 0-9 _ . @ -")
    if not isinstance(table, dict):
        raise AccessError(f"{path}: {where}: must be a table")
    for key in table:
        if key not in _KEYS:
            raise AccessError(f"{path}: {where}.{key}: unknown key (expected one of {', '.join(_KEYS)})")
    lists = {key: _strings(path, f"{where}.{key}", table.get(key, [])) for key in _KEYS}
    if not lists["networks"] and not lists["certificates"]:
        raise AccessError(f"{path}: {where}: names no networks and no certificates: nothing would be it")
    networks = []
    for text in lists["networks"]:
        try:
            networks.append(ipaddress.ip_network(text))
        except ValueError as err:
            raise AccessError(f"{path}: {where}.networks: {text!r} is not a network ({err})") from None
    for verb in ALL_VERBS:
        for pattern in lists[verb]:
            if not pattern or any(c.isspace() for c in pattern):
                raise AccessError(f"{path}: {where}.{verb}: {pattern!r} is not a queue-name pattern")
    return Identity(name, lists["certificates"], networks, {verb: lists[verb] for verb in ALL_VERBS})


def _strings(path: str, where: str, value: Any) -> List[str]:
    if not isinstance(value, list) or not all(isinstance(item, str) for item in value):
        raise AccessError(f"{path}: {where}: must be a list of strings")
    return list(value)


def _check_unique(path: str, identities: Sequence[Identity]) -> None:
    """A certificate name or a network given to two identities is ambiguous."""
    seen: Dict[object, str] = {}
    for identity in identities:
        for kind, values in (("certificates", identity.certificates), ("networks", identity.networks)):
            for value in values:
                other = seen.setdefault(value, identity.name)
                if other != identity.name:
                    raise AccessError(f"{path}: identities.{identity.name}.{kind}: {str(value)!r} "
                                      f"is {other}'s already")
