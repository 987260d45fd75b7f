"""Who the cluster is to an etcd with authentication on: the cluster file's
``[etcd] user`` and the password in its ``password_file``.

etcd's v3 gateway takes ``POST /v3/auth/authenticate {"name", "password"}``
and answers a token, which every later request carries in its
``Authorization`` header. A token lapses ``--auth-token-ttl`` seconds (300
by default) after its last use, or when the member restarts; a request
carrying a lapsed token is answered 401, "etcdserver: invalid auth token"
(gRPC code 16), and the client logs in again and repeats the request
(:class:`.coordination.Etcd` does, per endpoint). ``etcd3gw`` has no
authentication of its own: this module makes the one request itself,
through the client's session.

The password is read at each login, so that a new password in the file is
taken without a restart; it is never logged, nor is a token. The file must
be private to its owner, as the cluster's link secret is.
"""
from __future__ import annotations

import json
from typing import Any, Optional, Tuple

import etcd3gw
from etcd3gw.exceptions import Etcd3Exception

from ..privatefile import PrivateFileError, read_private
from .clusterfile import ClusterError

#: the gRPC status code of an answer to a lapsed token
UNAUTHENTICATED = 16


class LoginRefused(Exception):
    """etcd answered the login: not with these credentials; str() is etcd's reason."""


def load_password(path: str) -> str:
    """The password on the first line of ``path``, surrounding whitespace stripped."""
    try:
        data = read_private(path, "etcd password file",
                            "write the [etcd] user's password in it and chmod 600 it")
    except PrivateFileError as err:
        raise ClusterError(str(err)) from None
    lines = data.decode("utf-8", "replace").splitlines()
    password = lines[0].strip() if lines else ""
    if not password:
        raise ClusterError(f"etcd password file {path} has no password on its first line")
    return password


def log_in(client: etcd3gw.Etcd3Client, user: str, password: str) -> Optional[str]:
    """A fresh token for ``user`` from ``client``'s endpoint; None when that
    etcd has authentication off (it takes requests without one).
    :class:`LoginRefused` if etcd refuses the credentials; the client's
    errors if it does not answer."""
    try:
        # without the old token: etcd refuses a login that carries a lapsed one
        answer: Any = client.post(client.get_url("/auth/authenticate"), json={"name": user, "password": password},
                                  headers={"Authorization": None})
    except Etcd3Exception as err:
        _code, message = etcd_answer(err)
        if "authentication failed" in message:   # "..., invalid user ID or password"
            raise LoginRefused(message) from None
        if "authentication is not enabled" in message:
            return None
        raise
    token = answer.get("token") if isinstance(answer, dict) else None
    if not isinstance(token, str) or not token:
        raise Etcd3Exception("no token in the answer to a login", "malformed answer")
    return token


def token_refused(err: Etcd3Exception) -> bool:
    """Whether etcd refused a request for its token (lapsed, or none sent
    while authentication is on): a fresh login may get it through."""
    code, message = etcd_answer(err)
    return code == UNAUTHENTICATED or message.endswith("user name is empty")


def etcd_answer(err: Etcd3Exception) -> Tuple[Optional[int], str]:
    """The gRPC code and message of etcd's error answer in ``err`` (None and
    the client's own words when etcd did not answer with one)."""
    try:
        body = json.loads(err.detail_text or "")
    except ValueError:
        body = None
    if isinstance(body, dict) and isinstance(body.get("message"), str):
        code = body.get("code")
        return (code if isinstance(code, int) else None), body["message"]
    return None, f"{type(err).__name__}: {str(err) or err.detail_text or ''}"[:200]
