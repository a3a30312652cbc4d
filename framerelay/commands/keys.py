"""``framerelay keys generate|add|remove|public|list``: the token key set (JWKS).

The private key set stays in the primary cloud (ingest, orchestrator, the
operator's ``framerelay token mint``); workers get only ``keys public``.
Rotation: ``keys add`` (the new key verifies at once, the first key still
signs), later ``keys remove OLD`` (the new key then signs).
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

HELP = "create and rotate the token signing keys (a JWKS file)"


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("keys", help=HELP, description=HELP)
    verbs = p.add_subparsers(dest="verb", required=True, metavar="VERB")
    gen = verbs.add_parser("generate", help="write a new private key set (mode 0600)")
    gen.add_argument("--out", type=Path, required=True, help="private JWKS file to create")
    gen.add_argument("--public-out", type=Path, help="also write its public half (for workers)")
    _alg_kid(gen)
    gen.add_argument("--force", action="store_true", help="overwrite an existing file")
    gen.set_defaults(func=_generate)
    add = verbs.add_parser("add", help="add a key (verify-only until the keys before it go)")
    add.add_argument("file", type=Path)
    _alg_kid(add)
    add.set_defaults(func=_add)
    rm = verbs.add_parser(
        "remove", aliases=["rm"], help="remove a key by id (tokens it signed stop working)"
    )
    rm.add_argument("file", type=Path)
    rm.add_argument("kid")
    rm.set_defaults(func=_remove)
    pub = verbs.add_parser("public", help="print the public key set (give it to workers)")
    pub.add_argument("file", type=Path)
    pub.add_argument("--out", type=Path, help="write here instead of stdout")
    pub.set_defaults(func=_public)
    ls = verbs.add_parser("list", aliases=["ls"], help="key ids, algorithms, and which one signs")
    ls.add_argument("file", type=Path)
    ls.set_defaults(func=_list)


def _alg_kid(p: argparse.ArgumentParser) -> None:
    p.add_argument("--alg", choices=["EdDSA", "ES256", "HS256"], default="EdDSA",
                   help="EdDSA (default) or ES256: asymmetric; HS256: one host only")  # fmt: skip
    p.add_argument("--kid", help="key id (default <alg>-<date>-<random>)")


def read_keys(path: Path) -> object:
    from framerelay.auth.keys import KeySet
    from framerelay.errors import ConfigError

    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"cannot read key set {str(path)!r} ({exc.strerror})") from None
    return KeySet.from_json(text, source=str(path))


def write_private(path: Path, text: str, *, exist_ok: bool) -> None:
    from framerelay.errors import ConfigError

    flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | (0 if exist_ok else os.O_EXCL)
    try:
        fd = os.open(path, flags, 0o600)
    except FileExistsError:
        raise ConfigError(f"{path} exists; use 'keys add' to rotate, or --force") from None
    except OSError as exc:
        raise ConfigError(f"cannot write {str(path)!r} ({exc.strerror})") from None
    with os.fdopen(fd, "w", encoding="utf-8") as fh:
        os.fchmod(fd, 0o600)
        fh.write(text)


def _generate(args: argparse.Namespace) -> int:
    from framerelay.auth.keys import KeySet, generate

    keys = KeySet([generate(args.alg, args.kid)])
    write_private(args.out, keys.to_json(), exist_ok=args.force)
    print(f"wrote private key set {args.out} (key {keys.kids[0]}, {args.alg}); keep it secret",
          file=sys.stderr)  # fmt: skip
    if args.public_out is not None:
        args.public_out.write_text(keys.public().to_json(), encoding="utf-8")
        print(f"wrote public key set {args.public_out} (for workers)", file=sys.stderr)
    return 0


def _add(args: argparse.Namespace) -> int:
    from framerelay.auth.keys import KeySet, generate

    keys = read_keys(args.file)
    assert isinstance(keys, KeySet)  # noqa: S101
    new = generate(args.alg, args.kid)
    write_private(args.file, KeySet([*keys, new]).to_json(), exist_ok=True)
    print(f"added {new.kid}; {keys.signer().kid} still signs until it is removed", file=sys.stderr)
    return 0


def _remove(args: argparse.Namespace) -> int:
    from framerelay.auth.keys import KeySet
    from framerelay.errors import ConfigError

    keys = read_keys(args.file)
    assert isinstance(keys, KeySet)  # noqa: S101
    if keys.get(args.kid) is None:
        raise ConfigError(f"no key {args.kid!r} in {args.file} (it has {keys.kids})")
    rest = KeySet(k for k in keys if k.kid != args.kid)
    if not len(rest):
        raise ConfigError("refusing to remove the last key; generate a new set instead")
    write_private(args.file, rest.to_json(), exist_ok=True)
    print(f"removed {args.kid}; {rest.signer().kid} signs now", file=sys.stderr)
    return 0


def _public(args: argparse.Namespace) -> int:
    from framerelay.auth.keys import KeySet

    keys = read_keys(args.file)
    assert isinstance(keys, KeySet)  # noqa: S101
    text = keys.public().to_json()
    if args.out is not None:
        args.out.write_text(text, encoding="utf-8")
    else:
        sys.stdout.write(text)
    return 0


def _list(args: argparse.Namespace) -> int:
    from framerelay.auth.keys import KeySet

    keys = read_keys(args.file)
    assert isinstance(keys, KeySet)  # noqa: S101
    signer = next((k.kid for k in keys if k.private), None)
    for key in keys:
        kind = "private" if key.private else "public"
        print(f"{key.kid}\t{key.alg}\t{kind}" + ("\tsigns" if key.kid == signer else ""))
    return 0
