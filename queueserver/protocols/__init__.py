"""Wire protocol codecs: each turns bytes into commands and replies into bytes."""
from .workq import WorkqCodec

#: Codec class and default port of every protocol the server speaks.
CODECS = {
    "workq": WorkqCodec,
}
DEFAULT_PORTS = {
    "workq": 9922,
}
