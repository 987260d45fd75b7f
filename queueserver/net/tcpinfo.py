"""What the kernel says of a TCP socket's bytes: how many the peer's kernel
acknowledged, how many are still unacknowledged, whether it was reset.
The delivery rules of :mod:`.connection` and :mod:`.tlsrelay` read them."""
from __future__ import annotations

import fcntl
import socket
import struct
import termios
from typing import Final

_TCP_CLOSE: Final = 7                  # tcp_info.tcpi_state of a connection that was reset
_BYTES_ACKED: Final = struct.Struct("<Q")   # tcp_info.tcpi_bytes_acked, at byte 120 (Linux 4.1+)
_BYTES_ACKED_AT: Final = 120


def bytes_acked(sock: socket.socket) -> int:
    """Bytes of ``sock`` the peer's kernel has acknowledged (0 if unknown)."""
    try:
        info = sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, _BYTES_ACKED_AT + 8)
    except OSError:
        return 0
    if len(info) < _BYTES_ACKED_AT + 8:
        return 0
    acked: int = _BYTES_ACKED.unpack_from(info, _BYTES_ACKED_AT)[0]   # "<Q": an int
    return acked


def unacknowledged(fd: int) -> int:
    """Bytes sent that the peer has not acknowledged yet (SIOCOUTQ; on a
    Unix socket, bytes its peer has not read)."""
    try:
        return int.from_bytes(fcntl.ioctl(fd, termios.TIOCOUTQ, b"\0\0\0\0"), "little")
    except OSError:
        return 0


def was_reset(sock: socket.socket) -> bool:
    """Whether the peer reset the connection (an error is pending, or it is closed)."""
    try:
        if sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR):
            return True
        return sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 1)[0] == _TCP_CLOSE
    except OSError:
        return True
