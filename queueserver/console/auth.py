"""Who may act on the console, and proof that a form was ours.

**Tokens.** Actions (delete, requeue, purge) need a token from the token
file the config names (``[console] token_file``; the source reads it:
:meth:`~.source.ConsoleSource.token_names`, token -> the token's name). It
is sent as the ``X-Queueserver-Token`` header (scripts, curl) or as the
form field ``token`` (the pages' forms). Every configured token is compared
with :func:`hmac.compare_digest` (constant time), all of them every time, so
neither timing nor order tells which was close. No token file: no actions.

**CSRF.** A form post is a browser's doing, and a browser may be made to
post by another site. So a form post must carry, besides the token, the
hidden field ``csrf`` the page's form was rendered with (an HMAC, under a
secret made at process start, of the moment it was issued; valid for
:data:`CSRF_LIFETIME`) *and* come from our own origin: its ``Origin`` (or,
when a browser sends none, ``Referer``) must name the ``Host`` the request
was sent to; a post with neither is refused. A request with no token at all
is refused first, as :data:`MISSING_TOKEN` says, whatever else it lacks. A
request with the token in the
``X-Queueserver-Token`` header needs no CSRF field: another site's page
cannot set that header without a CORS preflight, which the console never
grants.
"""
from __future__ import annotations

import hashlib
import hmac
import os
import re
import time
from typing import Callable, Dict, Mapping, Optional
from urllib.parse import urlsplit

from .errors import Forbidden

#: The header an API client sends its token in.
TOKEN_HEADER = "X-Queueserver-Token"
#: The form field a page's form sends the token in.
TOKEN_FIELD = "token"
#: The hidden field of the CSRF token.
CSRF_FIELD = "csrf"
#: How long a rendered form's CSRF token stays good (seconds).
CSRF_LIFETIME = 12 * 3600

#: What a request with no token at all is told.
MISSING_TOKEN = (f"Token missing: this action needs a token from the console's token file, sent as the "
                 f"{TOKEN_HEADER} header (scripts) or typed into the page's form.")

_DIGITS = re.compile(r"\A[0-9]+\Z")


class Auth:
    """Token and CSRF checks over ``token_names`` (asked at every check, so a
    token file edited while the server runs is honoured)."""

    def __init__(self, token_names: Callable[[], Dict[str, str]], secret: Optional[bytes] = None,
                 clock: Callable[[], float] = time.time) -> None:
        self._token_names = token_names
        self._secret = secret if secret is not None else os.urandom(32)
        self._clock = clock

    # ------------------------------------------------------------- tokens
    def enabled(self) -> bool:
        """Whether any token is configured (no token: no actions at all)."""
        return bool(self._token_names())

    def who(self, token: Optional[str]) -> Optional[str]:
        """The name of ``token``, or None if it is none of the configured ones."""
        names = self._token_names()
        found: Optional[str] = None
        given = (token or "").encode("utf-8", "surrogateescape")
        for candidate, name in names.items():   # all of them, always: no early exit
            if hmac.compare_digest(given, candidate.encode("utf-8", "surrogateescape")) and given:
                found = name
        return found

    # --------------------------------------------------------------- CSRF
    def csrf_token(self) -> str:
        """A fresh CSRF token for a form: ``<issued>.<hmac>``."""
        issued = str(int(self._clock()))
        return f"{issued}.{self._mac(issued)}"

    def csrf_valid(self, value: Optional[str]) -> bool:
        issued, _, mac = (value or "").partition(".")
        if not _DIGITS.match(issued) or len(issued) > 12 or not mac:
            return False
        if not hmac.compare_digest(mac.encode(), self._mac(issued).encode()):
            return False
        return 0 <= self._clock() - int(issued) <= CSRF_LIFETIME

    def _mac(self, issued: str) -> str:
        return hmac.new(self._secret, b"csrf|" + issued.encode(), hashlib.sha256).hexdigest()

    # ----------------------------------------------------------- the check
    def authorize(self, headers: Mapping[str, str], form: Mapping[str, str]) -> str:
        """The name of whoever may act with this request, or :class:`Forbidden`.

        ``headers``: the request's headers, keys lower-case; ``form``: its
        form fields (the first value of each)."""
        header_token = headers.get(TOKEN_HEADER.lower())
        token = header_token if header_token is not None else form.get(TOKEN_FIELD)
        if not token:   # said first: whatever else is wrong, this is what is missing
            raise Forbidden(MISSING_TOKEN)
        if header_token is None:
            self.check_form(headers, form)
        if not self.enabled():
            raise Forbidden("Actions are turned off on this node: no token file is configured "
                            "([console] token_file).")
        name = self.who(token)
        if name is None:
            raise Forbidden("That token is not valid on this node.")
        return name

    def check_form(self, headers: Mapping[str, str], form: Mapping[str, str]) -> None:
        """The CSRF checks of a browser's form post (:class:`Forbidden` if one fails)."""
        if not same_origin(headers):
            raise Forbidden("This form was not posted from this console's own pages "
                            "(Origin/Referer does not match the host).")
        if not self.csrf_valid(form.get(CSRF_FIELD)):
            raise Forbidden("This form has expired or was not made by this console: "
                            "reload the page and try again.")


def same_origin(headers: Mapping[str, str]) -> bool:
    """Whether the request's ``Origin`` (or, failing that, ``Referer``) names
    the host it was sent to (``Host``, with its port). Neither: False."""
    host = (headers.get("host") or "").strip().lower()
    source = headers.get("origin")
    if source is None or source == "null":
        source = headers.get("referer")
    if not host or not source:
        return False
    try:
        parts = urlsplit(source.strip())
        netloc = parts.netloc.lower()
    except ValueError:
        return False
    return parts.scheme in ("http", "https") and netloc == host
