"""Small files beside the Spark output (checkpoint, report), through Hadoop's FileSystem.

The output directory may be on HDFS or S3 when the job runs on a cluster, so
the driver reads and writes its few small files through the same Hadoop
FileSystem Spark writes the tables with, instead of Python's ``open``.
"""
from __future__ import annotations

from typing import Any, List, Optional

# py4j ships no annotations (nor stubs); its Java objects are Any here
from py4j.protocol import Py4JJavaError  # type: ignore[import-untyped]
from pyspark.sql import SparkSession


class Storage:
    """Files under one root directory (``OUT``), named relative to it."""

    def __init__(self, spark: SparkSession, root: str) -> None:
        context = spark.sparkContext
        jvm, gateway = context._jvm, context._gateway
        assert jvm is not None and gateway is not None   # a running context has its JVM
        # Java objects through py4j (Any: untyped, every attribute a Java member)
        self._jvm: Any = jvm
        self._gateway: Any = gateway
        self._conf: Any = context._jsc.hadoopConfiguration()
        self.root = root.rstrip("/") or "/"
        self._fs = self._path("").getFileSystem(self._conf)

    def _path(self, name: str) -> Any:  # -> org.apache.hadoop.fs.Path
        return self._jvm.org.apache.hadoop.fs.Path(self.path(name))

    def path(self, name: str) -> str:
        """``name`` under the root, as Spark's readers and writers take it."""
        return f"{self.root}/{name}" if name else self.root

    def exists(self, name: str) -> bool:
        return bool(self._fs.exists(self._path(name)))

    def is_file(self, name: str) -> bool:
        """Whether ``name`` is there and is not a directory."""
        path = self._path(name)
        return bool(self._fs.exists(path)) and not self._fs.getFileStatus(path).isDirectory()

    def read_text(self, name: str) -> Optional[str]:
        """The file's text, or None when there is no such file. :class:`OSError`
        when it cannot be read: say, a local file whose Hadoop checksum
        sidecar (``.NAME.crc``) no longer matches it (``ChecksumException``)."""
        path = self._path(name)
        if not self._fs.exists(path):
            return None
        try:
            stream = self._fs.open(path)
            try:
                return str(self._jvm.org.apache.commons.io.IOUtils.toString(stream, "UTF-8"))
            finally:
                stream.close()
        except Py4JJavaError as err:
            java = err.java_exception
            raise OSError(f"{java.getClass().getSimpleName()}: {java.getMessage()}") from None

    def write_text(self, name: str, text: str) -> None:
        """Replace the file at once: readers see the old text or the new, never a part."""
        self._fs.mkdirs(self._path(name).getParent())
        tmp = self._path(f"{name}.tmp")
        stream = self._fs.create(tmp, True)
        try:
            stream.write(bytearray(text.encode("utf-8")))
        finally:
            stream.close()
        rename = self._jvm.org.apache.hadoop.fs.Options.Rename
        options = self._gateway.new_array(rename, 1)
        options[0] = rename.OVERWRITE
        context = self._jvm.org.apache.hadoop.fs.FileContext.getFileContext(
            self._path("").toUri(), self._conf)
        context.rename(tmp, self._path(name), options)

    def delete(self, name: str) -> None:
        """Remove a file or a whole directory; nothing when it is not there."""
        self._fs.delete(self._path(name), True)

    def list_dir(self, name: str) -> List[str]:
        """Names of the entries of a directory (empty when it does not exist)."""
        path = self._path(name)
        if not self._fs.exists(path):
            return []
        return sorted(str(status.getPath().getName()) for status in self._fs.listStatus(path))
