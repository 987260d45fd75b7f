"""A workq-protocol client for producers and workers.

Plain blocking sockets, so it works in threads and under gevent's monkey
patching alike. Every request leaves in one ``sendall`` with TCP_NODELAY;
:meth:`Client.pipeline` sends a whole batch in one write and reads all the
answers. Server errors raise :class:`WorkqError` subclasses carrying the
server's text.

Reconnecting: a request that could not be *sent* because the connection was
dead is sent again on a fresh connection. A request whose *answer* was lost
raises :class:`ConnectionLost` (the server may or may not have acted on it);
the next call reconnects.
"""
from __future__ import annotations

import datetime as _dt
import socket
from dataclasses import dataclass, field
from typing import (Callable, Dict, Generic, Iterable, List, NoReturn, Optional, Sequence, Tuple, TypeVar,
                    Union)

Payload = Union[bytes, str]
#: a value of ``inspect``: a number as an int, other text as str, the payload as bytes
Field = Union[int, str, bytes]
T = TypeVar("T")

DEFAULT_PORT = 9922


# ------------------------------------------------------------------ errors
class WorkqError(Exception):
    """An error answer from the server; ``code`` is its wire name."""

    code = ""

    def __init__(self, message: str = "") -> None:
        super().__init__(message or self.code)
        self.message = message


class ClientError(WorkqError):
    code = "CLIENT-ERROR"


class ServerError(WorkqError):
    code = "SERVER-ERROR"


class NotFound(WorkqError):
    code = "NOT-FOUND"


class TimedOut(WorkqError):
    code = "TIMEOUT"


class ConnectionLost(ConnectionError):
    """The connection broke before the answer arrived."""


_ERRORS = {cls.code: cls for cls in (ClientError, ServerError, NotFound, TimedOut)}


# ----------------------------------------------------------------- results
@dataclass
class Job:
    """A leased job."""
    id: str
    name: str
    payload: bytes


@dataclass
class Result:
    """A job's result, from ``run`` or ``result``."""
    id: str
    success: bool
    result: bytes


@dataclass
class JobInfo:
    """``inspect job``: every key the server sent, with numbers as ints."""
    id: str
    fields: Dict[str, Field] = field(default_factory=dict)

    def __getitem__(self, key: str) -> Field:
        return self.fields[key]

    @property
    def state(self) -> int:
        state = self.fields["state"]
        assert isinstance(state, int), state   # the server sends a number
        return state


def _bytes(data: Payload) -> bytes:
    return data.encode() if isinstance(data, str) else bytes(data)


def _flags(**flags: Optional[int]) -> str:
    return "".join(f" -{k.replace('_', '-')}={v}" for k, v in flags.items() if v is not None)


def _time(when: Union[str, _dt.datetime]) -> str:
    if isinstance(when, str):
        return when
    if when.tzinfo is not None:
        when = when.astimezone(_dt.timezone.utc).replace(tzinfo=None)
    return when.strftime("%Y-%m-%dT%H:%M:%SZ")


# ------------------------------------------------------------- reply reader
class _Reader:
    """Reads whole workq replies from a socket."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.buf = bytearray()

    def _fill(self) -> None:
        chunk = self.sock.recv(65536)
        if not chunk:
            raise ConnectionLost("server closed the connection")
        self.buf += chunk

    def line(self) -> bytes:
        while True:
            end = self.buf.find(b"\r\n")
            if end >= 0:
                line = bytes(self.buf[:end])
                del self.buf[:end + 2]
                return line
            self._fill()

    def exact(self, n: int) -> bytes:
        while len(self.buf) < n + 2:
            self._fill()
        data = bytes(self.buf[:n])
        del self.buf[:n + 2]
        return data


def _raise_for(line: bytes) -> NoReturn:
    text = line.decode(errors="replace")
    code, _, message = text[1:].partition(" ")
    raise _ERRORS.get(code, ServerError)(message or text[1:])


class _Request(Generic[T]):
    """One request's bytes and how to read its answer (a ``T``)."""

    __slots__ = ("data", "parse")

    def __init__(self, data: bytes, parse: Callable[[_Reader, bytes], T]) -> None:
        self.data = data
        self.parse = parse


def _ok(reader: _Reader, first: bytes) -> None:
    return None


def _blocks(reader: _Reader, first: bytes) -> List[List[bytes]]:
    """``+OK n`` then n items; each is a header line and its block or key lines."""
    items = []
    for _ in range(int(first[4:])):
        head = reader.line()
        parts = head.split(b" ")
        if len(parts) == 3:                      # <id> <x> <size> + block
            items.append(parts + [reader.exact(int(parts[2]))])
            continue
        lines = [head]
        size = 0
        for _ in range(int(parts[1])):           # inspect: key lines
            key_line = reader.line()
            if key_line.startswith(b"payload-size "):
                size = int(key_line[13:])
            elif key_line.startswith(b"payload "):
                while len(key_line) - 8 < size:  # the payload held CRLF
                    key_line += b"\r\n" + reader.line()
            lines.append(key_line)
        items.append(lines)
    return items


def _job(reader: _Reader, first: bytes) -> Job:
    id, name, _, payload = _blocks(reader, first)[0]
    return Job(id.decode(), name.decode(), payload)


def _result(reader: _Reader, first: bytes) -> Result:
    id, success, _, result = _blocks(reader, first)[0]
    return Result(id.decode(), success == b"1", result)


def _value(raw: bytes) -> Union[int, str]:
    text = raw.decode(errors="replace")
    return int(text) if text.lstrip("-").isdigit() else text


def _keyed(lines: List[bytes]) -> Tuple[str, Dict[str, Field]]:
    name = lines[0].split(b" ")[0].decode()
    fields: Dict[str, Field] = {}
    for line in lines[1:]:
        key, _, value = line.partition(b" ")
        fields[key.decode()] = value if key == b"payload" else _value(value)
    return name, fields


def _job_infos(reader: _Reader, first: bytes) -> List[JobInfo]:
    return [JobInfo(*_keyed(lines)) for lines in _blocks(reader, first)]


def _job_info(reader: _Reader, first: bytes) -> JobInfo:
    return _job_infos(reader, first)[0]


def _queues(reader: _Reader, first: bytes) -> Dict[str, Dict[str, Field]]:
    return dict(_keyed(lines) for lines in _blocks(reader, first))


def _single(reader: _Reader, first: bytes) -> Dict[str, Field]:
    return next(iter(_queues(reader, first).values()))


# -------------------------------------------------- requests shared by client and pipeline
def _add_request(id: str, name: str, payload: Payload, ttr: int, ttl: int, priority: Optional[int],
                 max_attempts: Optional[int], max_fails: Optional[int]) -> _Request[None]:
    body = _bytes(payload)
    flags = _flags(priority=priority, max_attempts=max_attempts, max_fails=max_fails)
    return _Request(f"add {id} {name} {ttr} {ttl} {len(body)}{flags}\r\n".encode() + body + b"\r\n", _ok)


def _finish_request(verb: str, id: str, result: Payload) -> _Request[None]:
    body = _bytes(result)
    return _Request(f"{verb} {id} {len(body)}\r\n".encode() + body + b"\r\n", _ok)


def _delete_request(id: str) -> _Request[None]:
    return _Request(f"delete {id}\r\n".encode(), _ok)


# ------------------------------------------------------------------ client
class Client:
    def __init__(self, host: str = "127.0.0.1", port: int = DEFAULT_PORT, timeout: float = 30.0,
                 connect_timeout: float = 5.0) -> None:
        self.host = host
        self.port = port
        self.timeout = timeout
        self.connect_timeout = connect_timeout
        self._sock: Optional[socket.socket] = None
        self._reader: Optional[_Reader] = None

    # connection
    def connect(self) -> None:
        sock = socket.create_connection((self.host, self.port), timeout=self.connect_timeout)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sock.settimeout(self.timeout)
        self._sock, self._reader = sock, _Reader(sock)

    def close(self) -> None:
        if self._sock is not None:
            try:
                self._sock.close()
            finally:
                self._sock = self._reader = None

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _exchange(self, requests: Sequence[_Request[T]], wait_ms: int = 0) -> List[Union[T, WorkqError]]:
        """Send ``requests`` in one write; read every answer (errors as exception objects)."""
        data = b"".join(r.data for r in requests)
        for attempt in (1, 2):
            if self._sock is None:
                self.connect()
            assert self._sock is not None
            try:
                self._sock.sendall(data)
                break
            except OSError:
                self.close()
                if attempt == 2:
                    raise
        assert self._sock is not None and self._reader is not None
        self._sock.settimeout(self.timeout + wait_ms / 1000.0)
        answers: List[Union[T, WorkqError]] = []
        try:
            for request in requests:
                first = self._reader.line()
                if first[:1] == b"-":
                    try:
                        _raise_for(first)
                    except WorkqError as err:
                        answers.append(err)
                    continue
                answers.append(request.parse(self._reader, first))
        except (OSError, ConnectionLost) as err:
            self.close()
            raise ConnectionLost(str(err)) from err
        return answers

    def _call(self, request: _Request[T], wait_ms: int = 0) -> T:
        answer = self._exchange([request], wait_ms)[0]
        if isinstance(answer, WorkqError):
            raise answer
        return answer

    # client commands
    def add(self, id: str, name: str, payload: Payload, ttr: int, ttl: int, *,
            priority: Optional[int] = None, max_attempts: Optional[int] = None,
            max_fails: Optional[int] = None) -> None:
        self._call(_add_request(id, name, payload, ttr, ttl, priority, max_attempts, max_fails))

    def schedule(self, id: str, name: str, payload: Payload, ttr: int, ttl: int,
                 time: Union[str, _dt.datetime], *, priority: Optional[int] = None,
                 max_attempts: Optional[int] = None, max_fails: Optional[int] = None) -> None:
        body = _bytes(payload)
        flags = _flags(priority=priority, max_attempts=max_attempts, max_fails=max_fails)
        self._call(_Request(f"schedule {id} {name} {ttr} {ttl} {_time(time)} {len(body)}{flags}\r\n".encode()
                            + body + b"\r\n", _ok))

    def run(self, id: str, name: str, payload: Payload, ttr: int, wait_timeout: int, *,
            priority: Optional[int] = None) -> Result:
        body = _bytes(payload)
        flags = _flags(priority=priority)
        request = _Request(f"run {id} {name} {ttr} {wait_timeout} {len(body)}{flags}\r\n".encode()
                           + body + b"\r\n", _result)
        return self._call(request, wait_timeout + ttr)

    def result(self, id: str, wait_timeout: int = 0) -> Result:
        return self._call(_Request(f"result {id} {wait_timeout}\r\n".encode(), _result), wait_timeout)

    # worker commands
    def lease(self, names: Union[str, Iterable[str]], wait_timeout: int = 60000) -> Job:
        names = [names] if isinstance(names, str) else list(names)
        request = _Request(f"lease {' '.join(names)} {wait_timeout}\r\n".encode(), _job)
        return self._call(request, wait_timeout)

    def complete(self, id: str, result: Payload = b"") -> None:
        self._call(_finish_request("complete", id, result))

    def fail(self, id: str, result: Payload = b"") -> None:
        self._call(_finish_request("fail", id, result))

    # administrative commands
    def delete(self, id: str) -> None:
        self._call(_delete_request(id))

    def inspect_job(self, id: str) -> JobInfo:
        return self._call(_Request(f"inspect job {id}\r\n".encode(), _job_info))

    def inspect_jobs(self, name: str, offset: int = 0, limit: int = 100) -> List[JobInfo]:
        return self._call(_Request(f"inspect jobs {name} {offset} {limit}\r\n".encode(), _job_infos))

    def inspect_scheduled_jobs(self, name: str, offset: int = 0, limit: int = 100) -> List[JobInfo]:
        return self._call(_Request(f"inspect scheduled-jobs {name} {offset} {limit}\r\n".encode(),
                                   _job_infos))

    def inspect_queue(self, name: str) -> Dict[str, Field]:
        return self._call(_Request(f"inspect queue {name}\r\n".encode(), _single))

    def inspect_queues(self, offset: int = 0, limit: int = 100) -> Dict[str, Dict[str, Field]]:
        return self._call(_Request(f"inspect queues {offset} {limit}\r\n".encode(), _queues))

    def inspect_server(self) -> Dict[str, Field]:
        return self._call(_Request(b"inspect server\r\n", _single))

    def pipeline(self) -> "Pipeline":
        return Pipeline(self)


class Pipeline:
    """Requests batched into one write; :meth:`execute` returns one answer per
    request, in order: ``None`` for ``+OK``, or the server's error as an exception object."""

    def __init__(self, client: Client) -> None:
        self.client = client
        self.requests: List[_Request[None]] = []

    def add(self, id: str, name: str, payload: Payload, ttr: int, ttl: int, *,
            priority: Optional[int] = None, max_attempts: Optional[int] = None,
            max_fails: Optional[int] = None) -> "Pipeline":
        self.requests.append(_add_request(id, name, payload, ttr, ttl, priority, max_attempts, max_fails))
        return self

    def complete(self, id: str, result: Payload = b"") -> "Pipeline":
        self.requests.append(_finish_request("complete", id, result))
        return self

    def fail(self, id: str, result: Payload = b"") -> "Pipeline":
        self.requests.append(_finish_request("fail", id, result))
        return self

    def delete(self, id: str) -> "Pipeline":
        self.requests.append(_delete_request(id))
        return self

    def __len__(self) -> int:
        return len(self.requests)

    def execute(self) -> List[Optional[WorkqError]]:
        requests, self.requests = self.requests, []
        return self.client._exchange(requests) if requests else []
