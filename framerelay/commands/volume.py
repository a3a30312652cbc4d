"""``framerelay volume sign|digest|verify``: the signed manifest of a shared volume.

Workers take a file from a shared volume (models, the model registry, built artefacts,
TensorRT engines) only when the volume's manifest, signed with the private key set,
lists its bytes (docs/security.md#shared-volumes). ``sign`` runs where that key set
lives: on the volume's files (``sign DIR``), or on a digest list made where the volume
is mounted (``digest DIR`` there, then ``sign --digests FILE --out FILE`` here). Signing
vouches for every file it lists: sign only what a build you trust wrote.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from framerelay.auth.keys import KeySet
    from framerelay.auth.manifest import FileDigest

HELP = "sign a shared volume's files for the workers that mount it (a manifest)"


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("volume", help=HELP, description=HELP)
    verbs = p.add_subparsers(dest="verb", required=True, metavar="VERB")
    sign = verbs.add_parser("sign", help="sign the files of DIR (or a digest list)")
    sign.add_argument("dir", type=Path, nargs="?", help="the volume's root, as mounted here")
    sign.add_argument("--keys", type=Path, required=True, help="the PRIVATE key set (JWKS)")
    sign.add_argument("--digests", type=Path, help="sign this list ('volume digest') instead")
    sign.add_argument("--out", type=Path, help="default: DIR/framerelay/manifest.jwt")
    sign.set_defaults(func=_sign)
    dig = verbs.add_parser("digest", help="print the digest list of DIR (needs no key)")
    dig.add_argument("dir", type=Path)
    dig.add_argument("--out", type=Path, help="write here instead of stdout")
    dig.set_defaults(func=_digest)
    ver = verbs.add_parser("verify", help="which files of DIR the manifest vouches for")
    ver.add_argument("dir", type=Path)
    ver.add_argument("--keys", type=Path, required=True, help="the key set (public suffices)")
    ver.set_defaults(func=_verify)


def _keys(path: Path) -> KeySet:
    from framerelay.auth.keys import KeySet
    from framerelay.commands.keys import read_keys

    keys = read_keys(path)
    assert isinstance(keys, KeySet)  # noqa: S101
    return keys


def _manifest_path(args: argparse.Namespace) -> Path:
    from framerelay.auth.manifest import MANIFEST_PATH
    from framerelay.errors import ConfigError

    if args.out is not None:
        return Path(args.out)
    if args.dir is None:
        raise ConfigError("give the volume's DIR, or --out for the manifest of --digests")
    return Path(args.dir) / MANIFEST_PATH


def _sign(args: argparse.Namespace) -> int:
    from framerelay.auth.manifest import digest_tree, digests_from_json, sign_manifest
    from framerelay.errors import ConfigError

    keys = _keys(args.keys)
    out = _manifest_path(args)
    if args.digests is not None:
        try:
            text = Path(args.digests).read_text(encoding="utf-8")
        except OSError as exc:
            raise ConfigError(f"cannot read {args.digests} ({exc.strerror})") from None
        files = digests_from_json(text, source=str(args.digests))
    elif args.dir is not None:
        files = digest_tree(Path(args.dir))
    else:
        raise ConfigError("give the volume's DIR (its files are signed) or --digests FILE")
    manifest = sign_manifest(files, keys)
    _report_changes(files, _previous(out, keys))
    _write(out, manifest + "\n")
    print(f"signed {len(files)} files with key {keys.signer().kid} into {out}", file=sys.stderr)
    return 0


def _previous(path: Path, keys: KeySet) -> Mapping[str, FileDigest]:
    """The files the manifest at ``path`` listed (none when there is none to trust)."""
    from framerelay.auth.manifest import ManifestError, verify_manifest

    try:
        return verify_manifest(path.read_text(encoding="utf-8"), keys.public()).files
    except (OSError, UnicodeDecodeError, ManifestError):
        return {}


def _report_changes(files: Mapping[str, FileDigest], before: Mapping[str, FileDigest]) -> None:
    """What this signature vouches for that the last one did not: look before trusting."""
    from framerelay.auth.manifest import PICKLE_SUFFIXES

    for rel in sorted(files):
        mark = "+" if rel not in before else "~" if before[rel] != files[rel] else ""
        if mark:
            print(f"  {mark} {rel}", file=sys.stderr)
        if Path(rel).suffix.lower() in PICKLE_SUFFIXES:
            note = "a pickle: workers never load it from a volume, signed or not (use ONNX)"
            print(f"  note: {rel} is {note}", file=sys.stderr)
    for rel in sorted(set(before) - set(files)):
        print(f"  - {rel}", file=sys.stderr)


def _write(path: Path, text: str) -> None:
    from framerelay.errors import ConfigError

    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(text)
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except OSError as exc:
        raise ConfigError(f"cannot write {path} ({exc.strerror})") from None


def _digest(args: argparse.Namespace) -> int:
    from framerelay.auth.manifest import digest_tree, digests_json

    text = digests_json(digest_tree(Path(args.dir)))
    if args.out is None:
        sys.stdout.write(text)
    else:
        _write(Path(args.out), text)
    return 0


def _verify(args: argparse.Namespace) -> int:
    """One line per file (ok, changed, unsigned, missing); 1 unless every one is ok."""
    from framerelay.auth.manifest import MANIFEST_PATH, digest_tree, verify_manifest
    from framerelay.errors import ConfigError

    root = Path(args.dir)
    try:
        text = (root / MANIFEST_PATH).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):
        raise ConfigError(f"no readable manifest at {root / MANIFEST_PATH}") from None
    signed = verify_manifest(text, _keys(args.keys)).files
    found = digest_tree(root)
    states = {rel: _state(signed.get(rel), found.get(rel)) for rel in sorted({*signed, *found})}
    for rel, state in states.items():
        print(f"{state}\t{rel}")
    bad = sum(state != "ok" for state in states.values())
    print(f"{len(states) - bad} files ok, {bad} not", file=sys.stderr)
    return 1 if bad else 0


def _state(signed: FileDigest | None, found: FileDigest | None) -> str:
    if signed is None:
        return "unsigned"
    if found is None:
        return "missing"
    return "ok" if signed == found else "changed"
