"""Credentials out of URLs and text before anything shows them: the one redaction every
view of every service uses (API answers, the console, logs, errors, metrics).

:func:`redact_url` replaces with ``***``:

- the **userinfo**, user and password both (``rtsp://admin:pw@cam/x`` shows as
  ``rtsp://***@cam/x``: a user name alone can be the credential, ``https://<token>@host``);
- the **value of every secret ``key=value`` pair** in the query (``&``-separated), the
  fragment (OAuth puts ``access_token`` there) and the path (``/key=value``, ``;key=value``
  and ``&`` between them: some cameras' style, ``/user=admin&password=x&channel=1``).
  Within one ``&``-separated item (or, in the path, one ``/`` segment and ``&`` item) a
  secret key masks everything after its ``=``, so a value holding ``;`` or ``=`` never
  shows in part; pairs after a ``;`` inside an item are looked at too.

A key is **secret** (:func:`secret_key`) when, percent-decoded and lower-cased, it is one
of :data:`SECRET_KEYS` or contains one of :data:`SECRET_WORDS`. That covers signed URLs
(AWS SigV4 ``X-Amz-Signature``, ``X-Amz-Credential``, ``X-Amz-Security-Token``; Google
``X-Goog-Signature``, ``X-Goog-Credential``, ``GoogleAccessId``; CloudFront ``Signature``,
``Policy``, ``Key-Pair-Id``; Azure SAS ``sig`` and the fields it signs, ``se``, ``sp``,
``sv``, ``st``, ``sr``, ``ss``, ``srt``, ``spr``, ``si``), tokens and keys (``token``,
``access_token``, ``api_key``, ``apikey``, ``key``, ``auth``, ``credential(s)``,
``session``, ``cookie``), passwords (``password``, ``passwd``, ``pass``, ``pwd``, ``pw``,
``psw``, ``secret``) and user names (``user``, ``username``, ``usr``, ``login``, Foscam's
``loginuse``/``loginpas``); FFmpeg option names too (``headers``, ``cookies``,
``decryption_key``, ``passphrase``: :func:`redact_options`). Masking a harmless value
(``keyframe=1``) costs only readability; the real URL is kept where it is used.

Not covered: a bare query item without ``=`` (``?abcdef``), and credentials in a path
that are not ``key=value`` (``/live/<token>/stream``): give those as query pairs.

:func:`secret_values` lists what to scrub from free text (an FFmpeg message may quote the
URL in another form); :func:`redact_text` redacts every URL inside a text.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from urllib.parse import unquote, unquote_plus

MASK = "***"
SECRET_WORDS = (
    "pass",
    "pwd",
    "secret",
    "private",
    "token",
    "key",
    "auth",
    "sig",
    "cred",
    "session",
    "cookie",
    "header",
)
"""A key that contains one of these (lower-cased) is secret."""
SECRET_KEYS = frozenset(
    {
        # passwords and user names too short or plain for SECRET_WORDS
        "pw",
        "psw",
        "user",
        "username",
        "usr",
        "login",
        "loginuse",
        "loginpas",
        # signed URLs: CloudFront, Google (v2)
        "policy",
        "googleaccessid",
        # Azure SAS: what its sig signs
        "se",
        "sp",
        "sv",
        "st",
        "sr",
        "ss",
        "srt",
        "spr",
        "si",
    }
)
"""Keys that are secret as they are (lower-cased)."""
MIN_SCRUBBED = 3
"""Secret pair values shorter than this are masked in URLs but not scrubbed from free
text (``sp=r`` would turn every ``r`` of a message into ``***``)."""
_PAIR = re.compile(r"(?:^|[&;])([^&;=]*)=")
_URL_IN_TEXT = re.compile(r"\b[A-Za-z][A-Za-z0-9+.-]{0,31}://[^\s'\"<>`]+")


def secret_key(name: str) -> bool:
    """Whether a query key, path parameter or FFmpeg option ``name`` holds a secret."""
    key = unquote_plus(name).strip().lower()
    return key in SECRET_KEYS or any(word in key for word in SECRET_WORDS)


def url_has_userinfo(url: str) -> bool:
    """Whether ``url`` has a ``user[:password]@`` part (an ``@`` before its path)."""
    _, sep, rest = url.partition("://")
    return bool(sep) and "@" in rest.split("/", 1)[0]


def redact_url(url: str) -> str:
    """``url`` without its credentials, for every view: ``rtsp://admin:pw@cam/x?token=t&ch=1``
    -> ``rtsp://***@cam/x?token=***&ch=1`` (see the module for what is masked)."""
    return _redact(url, [])


def secret_values(url: str) -> list[str]:
    """The secrets of ``url`` as they may appear in free text: its password (as written and
    percent-decoded) and its secret pair values of :data:`MIN_SCRUBBED` characters or more
    (as written, percent- and form-decoded). A user name beside a password is left out (it
    is masked in the URL, not hunted in messages); a userinfo without ``:`` is the token
    form (``https://<token>@host``) and is listed."""
    found: list[str] = []
    _redact(url, found)
    return list(dict.fromkeys(s for s in found if s))


def redact_text(text: str) -> str:
    """``text`` (an error, a log line, a traceback) with every URL in it redacted."""
    return _URL_IN_TEXT.sub(lambda m: redact_url(m.group(0)), text)


def redact_options(options: Mapping[str, str]) -> dict[str, str]:
    """FFmpeg options (or any settings) with the values of secret names masked."""
    return {k: MASK if secret_key(k) else v for k, v in options.items()}


def _redact(url: str, found: list[str]) -> str:
    """The redacted ``url``; the secrets it held are appended to ``found``."""
    scheme, sep, rest = url.partition("://")
    prefix = scheme + sep if sep else ""
    if not sep:
        rest = url
    elif url_has_userinfo(url):
        userinfo = rest.split("/", 1)[0].rpartition("@")[0]
        rest = rest[len(userinfo) + 1 :]
        prefix += MASK + "@"
        _, colon, password = userinfo.partition(":")
        secret = password if colon else userinfo
        found += [secret, unquote(secret)]
    if sep:
        end = min([i for i in (rest.find(c) for c in "/?#") if i >= 0], default=len(rest))
        prefix, rest = prefix + rest[:end], rest[end:]
    rest, hash_, fragment = rest.partition("#")
    path, question, query = rest.partition("?")
    return (
        prefix
        + _masked(path, ("/", "&"), found)
        + question
        + _masked(query, ("&",), found)
        + hash_
        + _masked(fragment, ("&",), found)
    )


def _masked(part: str, seps: tuple[str, ...], found: list[str]) -> str:
    """``part`` split on ``seps[0]`` (then the rest, in each piece), each piece masked."""
    if seps:
        return seps[0].join(_masked(piece, seps[1:], found) for piece in part.split(seps[0]))
    for match in _PAIR.finditer(part):
        if secret_key(match.group(1)):
            value = part[match.end() :]
            if not value:
                return part
            if len(value) >= MIN_SCRUBBED:
                found += [value, unquote(value), unquote_plus(value)]
            return part[: match.end()] + MASK
    return part
