"""Server configuration: defaults, a TOML file, then command-line flags.

A TOML file looks like::

    shards = 4
    bind = "127.0.0.1"
    runtime_dir = "/run/queueserver"
    log_level = "info"

    [workq]
    port = 9922
    enabled = true

Flags given on the command line override the file.
"""
from __future__ import annotations

import os
import tomllib
from dataclasses import dataclass, field
from typing import Any, Dict, Optional

from .protocols import DEFAULT_PORTS


@dataclass
class Listener:
    enabled: bool = True
    port: int = 0
    bind: Optional[str] = None   # None: the server-wide bind address
    options: Dict[str, Any] = field(default_factory=dict)


@dataclass
class Config:
    shards: int = field(default_factory=lambda: os.cpu_count() or 1)
    routers: int = 1
    bind: str = "127.0.0.1"
    runtime_dir: Optional[str] = None
    log_level: str = "info"
    listeners: Dict[str, Listener] = field(
        default_factory=lambda: {name: Listener(port=port) for name, port in DEFAULT_PORTS.items()})

    @classmethod
    def load(cls, path: Optional[str]) -> "Config":
        config = cls()
        if path:
            with open(path, "rb") as f:
                config.update(tomllib.load(f))
        return config

    def update(self, data: Dict[str, Any]) -> None:
        for key in ("shards", "routers", "bind", "runtime_dir", "log_level"):
            if key in data:
                setattr(self, key, data[key])
        for name, listener in self.listeners.items():
            section = data.get(name)
            if not isinstance(section, dict):
                continue
            section = dict(section)
            listener.enabled = bool(section.pop("enabled", listener.enabled))
            listener.port = int(section.pop("port", listener.port))
            listener.bind = section.pop("bind", listener.bind)
            listener.options.update(section)
        unknown = set(data) - {"shards", "routers", "bind", "runtime_dir", "log_level"} - set(self.listeners)
        if unknown:
            raise ValueError(f"unknown configuration keys: {', '.join(sorted(unknown))}")
        if int(self.shards) < 1 or int(self.routers) < 1:
            raise ValueError("shards and routers must be at least 1")
        self.shards = int(self.shards)
        self.routers = int(self.routers)
