"""Certificates for the TLS tests, made with the ``openssl`` command line:
certificate authorities, a server certificate for 127.0.0.1/localhost, and
client certificates (one expired, signed with ``openssl ca`` and dates in
the past). Keys are written 0600, as the server requires."""
from __future__ import annotations

import os
import subprocess
from pathlib import Path
from typing import Optional

_CA_CONFIG = """\
[ ca ]
default_ca = own
[ own ]
dir = {dir}
database = {dir}/index.txt
new_certs_dir = {dir}
serial = {dir}/serial
default_md = sha256
policy = anything
copy_extensions = copy
unique_subject = no
[ anything ]
commonName = supplied
[ client ]
basicConstraints = CA:FALSE
keyUsage = digitalSignature
extendedKeyUsage = clientAuth
"""


def _openssl(*args: str, cwd: Optional[Path] = None) -> None:
    subprocess.run(["openssl", *args], check=True, capture_output=True, cwd=cwd)


class CA:
    """A certificate authority in ``directory``: ``cert`` is its PEM certificate."""

    def __init__(self, directory: Path, name: str) -> None:
        self.dir = directory / name
        self.dir.mkdir(parents=True)
        self.name = name
        self.key = self.dir / "ca.key"
        self.cert = self.dir / "ca.pem"
        _openssl("req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
                 "-keyout", str(self.key), "-out", str(self.cert), "-days", "30", "-subj", f"/CN={name}")
        (self.dir / "index.txt").write_text("")
        (self.dir / "serial").write_text("1000\n")
        self.config = self.dir / "ca.cnf"
        self.config.write_text(_CA_CONFIG.format(dir=self.dir))

    def issue(self, name: str, server: bool = False, sans: str = "", days: int = 30,
              client_too: bool = False) -> "Issued":
        """A key and a certificate for ``name`` (CN) signed by this CA: for a
        server (SAN ``sans``, by default 127.0.0.1 and localhost; with
        ``client_too``, one it may present as a client as well, as a cluster
        node asks the others) or a client (``sans`` added, as ``DNS:x,email:y``)."""
        key, csr, cert = (self.dir / f"{name}.{ext}" for ext in ("key", "csr", "pem"))
        _openssl("req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
                 "-keyout", str(key), "-out", str(csr), "-subj", f"/CN={name}")
        os.chmod(key, 0o600)
        ext = self.dir / f"{name}.ext"
        if server:
            usage = "serverAuth,clientAuth" if client_too else "serverAuth"
            ext.write_text(f"subjectAltName={sans or 'IP:127.0.0.1,DNS:localhost'}\nextendedKeyUsage={usage}\n")
        else:
            ext.write_text("extendedKeyUsage=clientAuth\n" + (f"subjectAltName={sans}\n" if sans else ""))
        _openssl("x509", "-req", "-in", str(csr), "-CA", str(self.cert), "-CAkey", str(self.key),
                 "-CAcreateserial", "-out", str(cert), "-days", str(days), "-extfile", str(ext))
        return Issued(key, cert)

    def issue_expired(self, name: str) -> "Issued":
        """A client certificate whose validity ended a day ago (``openssl ca``
        sets dates in the past, which ``x509 -req`` cannot)."""
        key, csr, cert = (self.dir / f"{name}.{ext}" for ext in ("key", "csr", "pem"))
        _openssl("req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
                 "-keyout", str(key), "-out", str(csr), "-subj", f"/CN={name}")
        os.chmod(key, 0o600)
        _openssl("ca", "-batch", "-config", str(self.config), "-cert", str(self.cert), "-keyfile", str(self.key),
                 "-in", str(csr), "-out", str(cert), "-startdate", "20200101000000Z",
                 "-enddate", "20200201000000Z", "-extensions", "client", "-notext")
        return Issued(key, cert)


class Issued:
    def __init__(self, key: Path, cert: Path) -> None:
        self.key = key
        self.cert = cert
