"""Signed digest lists ("manifests") of the files on a shared volume.

Every pod of a tier mounts one writable volume (model files, the model registry, built
artefacts, TensorRT engines), so a pod that is taken over could replace any of them for
every later pod. A manifest is what the primary cloud vouches for: each file's path
(relative to the volume's root), size and sha256, signed as a JWT with the private key
set that signs tokens (``framerelay volume sign``, run where that key set lives). A
worker, which holds only the public half, accepts a file from the volume only when a
manifest it can verify lists that file with those exact bytes
(:mod:`gpu_worker.volume`).

The JWT's header names its key (``kid``) and has ``typ`` :data:`TYP`; its claims are
``iss`` ``framerelay``, ``aud`` :data:`AUD_VOLUME` (no token of any service is a manifest,
no manifest a token), ``iat``, and ``files``: ``{path: {"sha256": hex, "size": bytes}}``.
A manifest never expires: it is valid while the key that signed it is in the verifier's
key set (rotation: sign again after ``keys add``, before ``keys remove``).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

import jwt
from jwt.exceptions import InvalidAudienceError, InvalidTokenError, MissingRequiredClaimError

from framerelay.auth.keys import KeySet
from framerelay.auth.tokens import ISSUER
from framerelay.errors import AuthError, ConfigError

AUD_VOLUME = "framerelay-volume"
TYP = "framerelay-manifest+jwt"
MANIFEST_PATH = "framerelay/manifest.jwt"
"""Where a volume's manifest lives, relative to its root."""
MAX_MANIFEST_BYTES = 16 * 1024 * 1024
MAX_FILES = 100_000
PICKLE_SUFFIXES = frozenset({".pt", ".pth", ".pkl", ".pickle", ".ckpt"})
"""PyTorch and pickle files (loading one runs code): a worker never loads one from a
volume, whatever a manifest says."""
_SHA256 = re.compile(r"^[0-9a-f]{64}$")
_CHUNK = 1 << 20


class ManifestError(AuthError):
    """A manifest is missing, malformed, badly signed or signed with an unknown key."""


@dataclass(frozen=True, slots=True)
class FileDigest:
    """What a manifest says one file holds."""

    sha256: str
    size: int

    def as_json(self) -> dict[str, object]:
        return {"sha256": self.sha256, "size": self.size}


@dataclass(frozen=True, slots=True)
class Manifest:
    """A verified manifest: the files it vouches for, and who signed it when."""

    files: Mapping[str, FileDigest]
    kid: str
    iat: int

    def get(self, rel: str) -> FileDigest | None:
        return self.files.get(rel)


def file_digest(path: Path, max_bytes: int | None = None) -> FileDigest:
    """The size and sha256 of ``path`` (reading at most ``max_bytes`` + 1 bytes when given:
    a file longer than that gets ``size`` ``max_bytes + 1`` and the digest of that part)."""
    digest, size = hashlib.sha256(), 0
    limit = None if max_bytes is None else max_bytes + 1
    with path.open("rb") as fh:
        while limit is None or size < limit:
            chunk = fh.read(_CHUNK if limit is None else min(_CHUNK, limit - size))
            if not chunk:
                break
            digest.update(chunk)
            size += len(chunk)
    return FileDigest(digest.hexdigest(), size)


def tree_files(root: Path) -> Iterator[str]:
    """Every regular file under ``root`` a manifest may list, as a relative POSIX path, in
    order: symbolic links, names starting with ``.`` (temporary files, locks) and the
    manifest itself are left out."""
    for folder, dirs, files in os.walk(root, followlinks=False):
        dirs[:] = sorted(d for d in dirs if not d.startswith("."))
        for name in sorted(files):
            path = Path(folder) / name
            if name.startswith(".") or path.is_symlink() or not path.is_file():
                continue
            rel = path.relative_to(root).as_posix()
            if rel != MANIFEST_PATH:
                yield rel


def digest_tree(root: Path) -> dict[str, FileDigest]:
    """The digest of every file :func:`tree_files` lists under ``root``."""
    if not root.is_dir():
        raise ConfigError(f"{root} is not a directory (the volume's root)")
    files = {rel: file_digest(root / rel) for rel in tree_files(root)}
    if len(files) > MAX_FILES:
        raise ConfigError(f"{root} holds {len(files)} files; a manifest lists at most {MAX_FILES}")
    return files


def sign_manifest(
    files: Mapping[str, FileDigest], keys: KeySet, *, now: float | None = None
) -> str:
    """The manifest of ``files``, signed with the key set's signing key (the first private
    one); ConfigError for a public-only key set."""
    for rel, digest in files.items():
        _check_entry(rel, digest.as_json())
    key = keys.signer()
    claims = {
        "iss": ISSUER,
        "aud": AUD_VOLUME,
        "sub": "volume",
        "iat": int(time.time() if now is None else now),
        "files": {rel: files[rel].as_json() for rel in sorted(files)},
    }
    headers = {"kid": key.kid, "typ": TYP}
    return jwt.encode(claims, key.signing_key(), algorithm=key.alg, headers=headers)


def verify_manifest(text: str, keys: KeySet) -> Manifest:
    """The manifest ``text`` when ``keys`` verify it; :class:`ManifestError` (one line,
    saying why) otherwise."""
    text = text.strip()
    if not text or len(text) > MAX_MANIFEST_BYTES:
        raise ManifestError(f"the manifest is empty or over {MAX_MANIFEST_BYTES} bytes")
    try:
        header = jwt.get_unverified_header(text)
    except InvalidTokenError:
        raise ManifestError("the manifest is not a JWT (header.claims.signature)") from None
    if header.get("typ") != TYP:
        raise ManifestError(f"the manifest's typ is not {TYP!r} (a token is no manifest)")
    kid = header.get("kid")
    key = keys.get(kid) if isinstance(kid, str) else None
    if key is None:
        raise ManifestError(
            f"the manifest is signed with unknown key id {str(kid)[:64]!r} (removed, or not "
            "in this worker's key set): sign the volume again"
        )
    try:
        raw = jwt.decode(
            text,
            key.verifying_key(),
            algorithms=[key.alg],
            audience=AUD_VOLUME,
            issuer=ISSUER,
            options={"require": ["iat", "aud", "iss"]},
        )
    except InvalidAudienceError:
        raise ManifestError(f"the manifest is not for {AUD_VOLUME!r}") from None
    except MissingRequiredClaimError as exc:
        raise ManifestError(f"the manifest lacks claim {exc.claim!r}") from None
    except InvalidTokenError as exc:
        raise ManifestError(f"the manifest's signature does not verify ({_why(exc)})") from None
    return Manifest(_files(raw.get("files")), key.kid, int(raw["iat"]))


def _why(exc: InvalidTokenError) -> str:
    name = type(exc).__name__
    if name == "InvalidSignatureError":
        return "wrong key, or the manifest was changed after signing"
    return name


def _files(raw: object) -> dict[str, FileDigest]:
    if not isinstance(raw, dict) or len(raw) > MAX_FILES:
        raise ManifestError(f"the manifest's 'files' must map at most {MAX_FILES} paths")
    return {rel: _check_entry(rel, entry) for rel, entry in raw.items()}


def _check_entry(rel: object, entry: object) -> FileDigest:
    if not isinstance(rel, str) or not is_relative_path(rel):
        raise ManifestError(f"the manifest lists {str(rel)[:100]!r}, not a path inside the volume")
    if not isinstance(entry, dict):
        raise ManifestError(f"the manifest's entry for {rel[:100]!r} is not an object")
    sha, size = entry.get("sha256"), entry.get("size")
    if not isinstance(sha, str) or _SHA256.fullmatch(sha) is None:
        raise ManifestError(f"the manifest's sha256 of {rel[:100]!r} is not 64 hex digits")
    if not isinstance(size, int) or isinstance(size, bool) or size < 0:
        raise ManifestError(f"the manifest's size of {rel[:100]!r} is not a whole number")
    return FileDigest(sha, size)


def is_relative_path(rel: str) -> bool:
    """A normalised POSIX path below a root: no ``..``, ``.``, empty part or leading ``/``."""
    parts = PurePosixPath(rel).parts
    return (
        bool(parts)
        and not rel.startswith("/")
        and "\\" not in rel
        and "\x00" not in rel
        and PurePosixPath(*parts).as_posix() == rel
        and all(p not in (".", "..") for p in parts)
    )


def digests_json(files: Mapping[str, FileDigest]) -> str:
    """A digest list as JSON (``framerelay volume digest``)."""
    body = {"files": {rel: files[rel].as_json() for rel in sorted(files)}}
    return json.dumps(body, indent=1) + "\n"


def digests_from_json(text: str, *, source: str) -> dict[str, FileDigest]:
    """The digest list ``text`` (from :func:`digests_json`); ConfigError naming ``source``."""
    try:
        doc: Any = json.loads(text)
    except ValueError:
        raise ConfigError(
            f"{source} is not JSON; expected 'framerelay volume digest' output"
        ) from None
    try:
        return _files(doc.get("files") if isinstance(doc, dict) else None)
    except ManifestError as exc:
        raise ConfigError(f"{source}: {str(exc).replace('the manifest', 'the list')}") from None


__all__ = [
    "AUD_VOLUME",
    "MANIFEST_PATH",
    "PICKLE_SUFFIXES",
    "TYP",
    "FileDigest",
    "Manifest",
    "ManifestError",
    "digest_tree",
    "digests_from_json",
    "digests_json",
    "file_digest",
    "is_relative_path",
    "sign_manifest",
    "tree_files",
    "verify_manifest",
]
