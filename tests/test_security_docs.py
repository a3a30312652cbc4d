"""The security guide (docs/security.md): its commands run as written and do what it says."""

from __future__ import annotations

import json
import os
import shutil
import socket
import ssl
import stat
import subprocess
import sys
import threading
from pathlib import Path

import jwt

from tests.conftest import ROOT

GUIDE = (ROOT / "docs" / "security.md").read_text(encoding="utf-8")


def security_commands() -> list[str]:
    blocks = [b.split("```", 1)[0] for b in GUIDE.split("```sh\n")[1:]]
    return [line for b in blocks for line in b.splitlines() if line and not line.startswith("#")]


def test_security_section_commands_run(tmp_path: Path) -> None:
    commands = security_commands()
    assert any(c.startswith("framerelay keys generate") for c in commands)
    bindir = tmp_path / "bin"
    bindir.mkdir()
    shim = bindir / "framerelay"  # the CLI as installed: `framerelay ...`
    shim.write_text(f'#!/bin/sh\nexec {sys.executable} -m framerelay "$@"\n')
    shim.chmod(0o755)
    env = {"PATH": f"{bindir}:{os.environ['PATH']}", "HOME": str(tmp_path),
           "PYTHONPATH": str(ROOT)}  # fmt: skip
    script = "set -euo pipefail\n" + "\n".join(commands) + "\n"
    bash = shutil.which("bash")
    assert bash is not None
    proc = subprocess.run([bash, "-c", script], cwd=tmp_path, env=env, capture_output=True,
                          text=True, timeout=120, check=False)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr

    assert stat.S_IMODE((tmp_path / "keys.jwks").stat().st_mode) == 0o600
    public = json.loads((tmp_path / "workers.jwks").read_text())
    assert [k["kid"] for k in public["keys"]] == ["2027-01"]  # rotated: the old key is gone
    assert all("d" not in k for k in public["keys"])
    assert "2027-01\tEdDSA\tprivate\tsigns" in proc.stdout.splitlines()

    app_jti = jwt.decode(
        (tmp_path / "app.token").read_text().strip(), options={"verify_signature": False}
    )["jti"]
    revoked = (tmp_path / "revoked.txt").read_text().splitlines()
    assert revoked == [f"jti:{app_jti}", "sub:lobby-app"]

    app = (tmp_path / "app.token").read_text().strip()
    claims = jwt.decode(app, options={"verify_signature": False})
    assert claims["aud"] == "framerelay-ingest" and claims["scope"] == "results:cam-1"
    assert claims["sub"] == "lobby-app" and claims["exp"] - claims["iat"] in (
        30 * 86_400,
        30 * 86_400 + 1,
    )
    assert jwt.get_unverified_header(app)["kid"] == "2026-12"  # signed before the rotation
    ops = jwt.decode((tmp_path / "ops.token").read_text().strip(),
                     options={"verify_signature": False})  # fmt: skip
    assert ops["aud"] == "framerelay-orchestrator" and ops["scope"] == "fleet:read fleet:write"

    handshake(tmp_path / "ca" / "ca.pem", tmp_path / "ingest.pem", tmp_path / "ingest.key")
    assert stat.S_IMODE((tmp_path / "ingest.key").stat().st_mode) == 0o600
    assert stat.S_IMODE((tmp_path / "ca" / "ca.key").stat().st_mode) == 0o600


def handshake(ca: Path, cert: Path, key: Path) -> None:
    """A real TLS handshake: the issued certificate verifies as ingest.internal under the CA."""
    client = ssl.create_default_context(cafile=str(ca))
    server = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    server.load_cert_chain(str(cert), str(key))
    a, b = socket.socketpair()
    errors: list[BaseException] = []

    def serve() -> None:
        try:
            with server.wrap_socket(b, server_side=True) as tls:
                tls.recv(1)
        except (OSError, ssl.SSLError) as exc:
            errors.append(exc)

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    with client.wrap_socket(a, server_hostname="ingest.internal") as tls:
        tls.sendall(b"x")
    thread.join(10)
    assert not errors, errors
