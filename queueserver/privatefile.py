"""Files that hold a secret (the cluster's link secret, etcd's password, a TLS key):
read only when private to their owner, like an ssh key, since whoever can
read one can act as the cluster."""
from __future__ import annotations

import os
import stat
from typing import Tuple


class PrivateFileError(ValueError):
    """The file cannot be used as a secret's; str() is one line saying what to change."""


def read_regular(path: str, what: str, how_to_make: str) -> bytes:
    """``path``'s bytes, if it is a regular file the server may read (a
    certificate: public, but read with the same care and the same messages)."""
    return _read(path, what, how_to_make)[0]


def read_private(path: str, what: str, how_to_make: str) -> bytes:
    """``path``'s bytes, if it is a regular file that only its owner may
    read or write. ``what`` names the file in the messages ("shared secret
    file"); ``how_to_make`` says how to create it when it is missing."""
    data, mode = _read(path, what, how_to_make)
    if stat.S_IMODE(mode) & 0o077:
        raise PrivateFileError(f"{what} {path} is accessible by group or others "
                               f"(mode {stat.S_IMODE(mode):04o}): chmod 600 it")
    return data


def _read(path: str, what: str, how_to_make: str) -> Tuple[bytes, int]:
    """The bytes and mode of the regular file at ``path``."""
    try:
        with open(path, "rb") as f:
            mode = os.fstat(f.fileno()).st_mode   # of the file read, not of a name that may change
            if not stat.S_ISREG(mode):
                raise PrivateFileError(f"{what} {path} is not a regular file: point to the file itself")
            data = f.read()
    except FileNotFoundError:
        raise PrivateFileError(f"{what} {path} does not exist: {how_to_make}") from None
    except IsADirectoryError:
        raise PrivateFileError(f"{what} {path} is a directory: point to the file itself") from None
    except OSError as exc:
        raise PrivateFileError(f"cannot read {what} {path} ({exc.strerror}): "
                               f"make it readable by the server's user") from None
    return data, mode
