"""``framerelay keys`` and ``framerelay token mint`` as a user runs them (subprocesses).

Tokens the CLI mints verify with PyJWT alone, given only the public key set,
and with Node's ``jose`` when Node and npm are on the machine.
"""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import jwt
import pytest

CLI = [sys.executable, "-m", "framerelay"]
JOSE_DIR = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "framerelay-test-jose"


def run(*args: str, cwd: Path, ok: bool = True) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run([*CLI, *args], cwd=cwd, capture_output=True, text=True, timeout=60)
    if ok:
        assert proc.returncode == 0, proc.stderr
    return proc


def mint(cwd: Path, *extra: str) -> str:
    out = run("token", "mint", "--keys", "k.jwks", "--aud", "ingest", *extra, cwd=cwd).stdout
    return out.strip()


@pytest.fixture
def keydir(tmp_path: Path) -> Path:
    run(
        "keys",
        "generate",
        "--out",
        "k.jwks",
        "--public-out",
        "p.jwks",
        "--kid",
        "one",
        cwd=tmp_path,
    )
    return tmp_path


def pyjwt_verify(token: str, public: Path, aud: str = "framerelay-ingest") -> dict[str, object]:
    jwks = jwt.PyJWKSet.from_json(public.read_text())
    kid = jwt.get_unverified_header(token)["kid"]
    key = next(k for k in jwks.keys if k.key_id == kid)
    claims: dict[str, object] = jwt.decode(
        token, key.key, algorithms=["EdDSA", "ES256"], audience=aud, issuer="framerelay"
    )
    return claims


def test_generate_writes_a_private_file_and_a_public_one(keydir: Path) -> None:
    assert stat.S_IMODE((keydir / "k.jwks").stat().st_mode) == 0o600
    public = json.loads((keydir / "p.jwks").read_text())
    assert [k["kid"] for k in public["keys"]] == ["one"]
    assert "d" not in public["keys"][0]
    again = run("keys", "generate", "--out", "k.jwks", cwd=keydir, ok=False)
    assert again.returncode == 2 and "exists" in again.stderr and "Traceback" not in again.stderr


def test_minted_token_verifies_with_pyjwt_alone(keydir: Path) -> None:
    token = mint(keydir, "--scope", "results:cam-1", "--scope", "streams:read", "--ttl", "10m",
                 "--sub", "dashboard")  # fmt: skip
    claims = pyjwt_verify(token, keydir / "p.jwks")
    assert claims["scope"] == "results:cam-1 streams:read"
    assert claims["sub"] == "dashboard"
    assert int(str(claims["exp"])) - int(str(claims["iat"])) in (600, 601)


def test_rotation_with_the_cli(keydir: Path) -> None:
    old = mint(keydir, "--scope", "results:*")
    run("keys", "add", "k.jwks", "--kid", "two", cwd=keydir)
    listing = run("keys", "list", "k.jwks", cwd=keydir).stdout
    assert "one\tEdDSA\tprivate\tsigns" in listing and "two\tEdDSA\tprivate\n" in listing
    run("keys", "public", "k.jwks", "--out", "p.jwks", cwd=keydir)
    pyjwt_verify(old, keydir / "p.jwks")  # both listed: the old token still works
    assert jwt.get_unverified_header(mint(keydir, "--scope", "results:*"))["kid"] == "one"
    run("keys", "remove", "k.jwks", "one", cwd=keydir)
    run("keys", "public", "k.jwks", "--out", "p.jwks", cwd=keydir)
    new = mint(keydir, "--scope", "results:*")
    assert jwt.get_unverified_header(new)["kid"] == "two"
    pyjwt_verify(new, keydir / "p.jwks")
    with pytest.raises(StopIteration):  # the old key is gone from the public set
        pyjwt_verify(old, keydir / "p.jwks")


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["--keys", "missing.jwks", "--scope", "results:*", "--aud", "ingest"], "cannot read"),
        (["--keys", "k.jwks", "--scope", "results:*", "--aud", "ingest", "--ttl", "5y"], "--ttl"),
        (["--keys", "p.jwks", "--scope", "results:*", "--aud", "ingest"], "public keys"),
        (["--keys", "k.jwks", "--scope", "results:*", "--aud", "ingest", "--ttl", "0"], "lifetime"),
    ],
)
def test_bad_input_is_one_line(keydir: Path, args: list[str], needle: str) -> None:
    proc = run("token", "mint", *args, cwd=keydir, ok=False)
    assert proc.returncode == 2, proc.stderr
    assert needle in proc.stderr and "Traceback" not in proc.stderr
    assert proc.stdout == ""


def _jose() -> Path:
    """Node's jose package in a cache folder (installed once from the npm registry)."""
    node, npm = shutil.which("node"), shutil.which("npm")
    if node is None or npm is None:
        pytest.skip("node/npm not on this machine: the jose interop check needs them")
    if not (JOSE_DIR / "node_modules" / "jose").is_dir():
        JOSE_DIR.mkdir(parents=True, exist_ok=True)
        proc = subprocess.run(
            [npm, "install", "--silent", "--no-audit", "--no-fund", "jose@5"],
            cwd=JOSE_DIR, capture_output=True, text=True, timeout=180, check=False,
        )  # fmt: skip
        if proc.returncode != 0:
            pytest.skip(f"npm could not install jose: {proc.stderr.strip()[-200:]}")
    return JOSE_DIR


JOSE_VERIFY = """
const jose = require('jose');
const [jwks, token] = [JSON.parse(process.argv[1]), process.argv[2]];
jose.jwtVerify(token, jose.createLocalJWKSet(jwks),
               {audience: 'framerelay-ingest', issuer: 'framerelay'})
  .then(r => console.log(JSON.stringify(r.payload)))
  .catch(e => { console.error(e.code); process.exit(1); });
"""


@pytest.mark.parametrize("alg", ["EdDSA", "ES256"])
def test_minted_token_verifies_with_node_jose(tmp_path: Path, alg: str) -> None:
    jose = _jose()
    run("keys", "generate", "--out", "k.jwks", "--public-out", "p.jwks", "--alg", alg, cwd=tmp_path)
    token = mint(tmp_path, "--scope", "results:cam-1")
    node = shutil.which("node")
    assert node is not None
    proc = subprocess.run(
        [node, "-e", JOSE_VERIFY, (tmp_path / "p.jwks").read_text(), token],
        cwd=jose, capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["scope"] == "results:cam-1"
    tampered = token[:-4] + ("AAAA" if not token.endswith("AAAA") else "BBBB")
    bad = subprocess.run(
        [node, "-e", JOSE_VERIFY, (tmp_path / "p.jwks").read_text(), tampered],
        cwd=jose, capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert bad.returncode == 1
