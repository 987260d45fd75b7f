"""The answer to a connection the server will not serve (too many clients,
no file descriptor left): one error in the protocol's own form, sent
before the connection is closed, so a client sees why instead of a reset."""
from __future__ import annotations

import base64
import struct


def refusal(protocol: str, message: str) -> bytes:
    """``message`` as ``protocol``'s error reply (TaskFlux: a transport error)."""
    text = message.encode()
    if protocol == "workq":
        return b"-SERVER-ERROR " + text + b"\r\n"
    if protocol == "takeanumber":
        return b"-ERR " + text + b".\r\n"
    if protocol == "goqueue":
        return b"ERROR\0" + text + b"\0"
    if protocol == "queued":
        return b"ERROR " + base64.b64encode(text) + b"\n"
    if protocol == "taskflux":
        return b"e" + struct.pack(">i", len(text)) + text
    raise ValueError(f"unknown protocol {protocol!r}")
