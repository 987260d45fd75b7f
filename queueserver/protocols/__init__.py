"""Wire protocol codecs: each turns bytes into commands and replies into bytes.

Codecs are named here and imported when a listener for them starts.
"""
from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Type

if TYPE_CHECKING:
    from .base import StreamCodec

#: protocol -> (module, codec class, default port)
PROTOCOLS = {
    "workq": ("queueserver.protocols.workq", "WorkqCodec", 9922),
    "takeanumber": ("queueserver.protocols.takeanumber", "TakeANumberCodec", 13331),
    "goqueue": ("queueserver.protocols.goqueue", "GoqueueCodec", 11223),
    "queued": ("queueserver.protocols.queued", "QueuedCodec", 9001),
    "taskflux": ("queueserver.protocols.taskflux", "TaskFluxCodec", 2602),
}
DEFAULT_PORTS = {name: port for name, (_, _, port) in PROTOCOLS.items()}


def codec_class(protocol: str) -> Type[StreamCodec]:
    module, name, _ = PROTOCOLS[protocol]
    codec: Type[StreamCodec] = getattr(importlib.import_module(module), name)
    return codec
