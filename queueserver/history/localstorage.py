"""Small files beside the output (checkpoint, report) on the local disk: the Python engine's storage.

The same calls as :class:`.storage.Storage`, which goes through Hadoop's
FileSystem for Spark. Hadoop's local file system keeps a checksum sidecar
(``.NAME.crc``) beside each file it writes and checks it on reading, so a
file replaced here loses its stale sidecar: Spark then reads it unchecked
instead of refusing it.
"""
from __future__ import annotations

import os
import shutil
from typing import List, Optional


class LocalStorage:
    """Files under one local root directory (``OUT``), named relative to it."""

    def __init__(self, root: str) -> None:
        self.root = root.rstrip("/") or "/"

    def path(self, name: str) -> str:
        return os.path.join(self.root, name) if name else self.root

    def exists(self, name: str) -> bool:
        return os.path.exists(self.path(name))

    def is_file(self, name: str) -> bool:
        return os.path.exists(self.path(name)) and not os.path.isdir(self.path(name))

    def read_text(self, name: str) -> Optional[str]:
        """The file's text, or None when there is no such file; :class:`OSError` when it
        cannot be read."""
        try:
            with open(self.path(name), encoding="utf-8") as f:
                return f.read()
        except FileNotFoundError:
            return None
        except UnicodeDecodeError as err:
            raise OSError(f"not UTF-8 text: {err}") from None

    def write_text(self, name: str, text: str) -> None:
        """Replace the file at once: readers see the old text or the new, never a part."""
        path = self.path(name)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        tmp = f"{path}.tmp"
        with open(tmp, "w", encoding="utf-8") as f:
            f.write(text)
        os.replace(tmp, path)
        crc = os.path.join(os.path.dirname(path), f".{os.path.basename(path)}.crc")
        if os.path.exists(crc):
            os.unlink(crc)

    def delete(self, name: str) -> None:
        """Remove a file or a whole directory; nothing when it is not there."""
        path = self.path(name)
        if os.path.isdir(path) and not os.path.islink(path):
            shutil.rmtree(path)
        elif os.path.lexists(path):
            os.unlink(path)

    def list_dir(self, name: str) -> List[str]:
        path = self.path(name)
        return sorted(os.listdir(path)) if os.path.isdir(path) else []
