"""Watching connections that are not being read for their client leaving.

A connection whose client pipelines without reading is no longer read, so
its end of file would go unseen behind the unread requests. One epoll set
per process, registered for ``EPOLLRDHUP`` only and watched by the event
loop, tells the moment such a client sends its FIN or resets.
"""
from __future__ import annotations

import select
from typing import Dict, Protocol

import gevent


class Watched(Protocol):
    """A connection not being read (:class:`~.connection.ClientConnection`)."""

    def hung_up(self, reset: bool) -> None: ...


class HangupWatch:
    def __init__(self) -> None:
        self._epoll = select.epoll()
        self._watched: Dict[int, Watched] = {}
        self._watcher = gevent.get_hub().loop.io(self._epoll.fileno(), 1)
        self._watcher.start(self._ready)

    def watch(self, fd: int, connection: Watched) -> None:
        """Call ``connection.hung_up(reset)`` when the peer of ``fd`` sends its
        FIN (``reset`` False: it may still read) or resets the connection."""
        self._watched[fd] = connection
        self._epoll.register(fd, select.EPOLLRDHUP)

    def unwatch(self, fd: int) -> None:
        if self._watched.pop(fd, None) is not None:
            try:
                self._epoll.unregister(fd)
            except OSError:
                pass

    def _ready(self) -> None:
        for fd, events in self._epoll.poll(0):
            connection = self._watched.get(fd)
            if connection is None:
                self.unwatch(fd)
            else:
                connection.hung_up(bool(events & (select.EPOLLERR | select.EPOLLHUP)))

    def stop(self) -> None:
        self._watcher.stop()
