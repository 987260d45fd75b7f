"""A raw workq wire reader for tests: sends bytes, reads exactly one reply.

It parses replies the way a client written for the original server does
(line, then length-prefixed blocks), so tests compare exact bytes.
"""
from __future__ import annotations

import socket
import uuid


def new_id() -> str:
    return str(uuid.uuid4())


class Wire:
    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.buf = b""

    def send(self, data: bytes) -> None:
        self.sock.sendall(data)

    def _fill(self) -> None:
        chunk = self.sock.recv(65536)
        if not chunk:
            raise ConnectionError("server closed the connection")
        self.buf += chunk

    def line(self) -> bytes:
        while b"\r\n" not in self.buf:
            self._fill()
        line, self.buf = self.buf.split(b"\r\n", 1)
        return line + b"\r\n"

    def exact(self, n: int) -> bytes:
        while len(self.buf) < n:
            self._fill()
        data, self.buf = self.buf[:n], self.buf[n:]
        return data

    def reply(self) -> bytes:
        """One whole workq reply, as bytes."""
        first = self.line()
        if not first.startswith(b"+OK ") :
            return first
        count = int(first[4:-2])
        out = [first]
        for _ in range(count):
            head = self.line()
            out.append(head)
            parts = head[:-2].split(b" ")
            if len(parts) == 3:  # lease / result / run: "<id> <x> <size>" then a block
                out.append(self.exact(int(parts[2]) + 2))
                continue
            payload_size = 0
            for _ in range(int(parts[1])):  # inspect: "<id|name> <key-count>" then keys
                key_line = self.line()
                if key_line.startswith(b"payload-size "):
                    payload_size = int(key_line[13:-2])
                elif key_line.startswith(b"payload "):
                    # the payload may hold CRLF: trust payload-size
                    missing = payload_size - (len(key_line) - len(b"payload ") - 2)
                    if missing > 0:
                        key_line += self.exact(missing) + self.line()
                out.append(key_line)
        return b"".join(out)

    def call(self, data: bytes) -> bytes:
        self.send(data)
        return self.reply()

    def close(self) -> None:
        self.sock.close()


def add(id: str, name: str = "q", payload: bytes = b"data", ttr: int = 10000, ttl: int = 60000,
        flags: str = "") -> bytes:
    flags = f" {flags}" if flags else ""
    return f"add {id} {name} {ttr} {ttl} {len(payload)}{flags}\r\n".encode() + payload + b"\r\n"
