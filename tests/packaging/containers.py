"""Run an image's contract without Docker: its commands, against the installed wheel.

No image registry is reachable here, so ``FROM`` cannot pull a base image. What
an image promises is tested instead: its final stage's ENTRYPOINT + CMD (or a
command compose gives it) run under its USER (``setpriv``, no groups), with
exactly its ENV (plus what the test must set: keys, free ports), in its
WORKDIR, in a private mount namespace (``unshare --mount``) where every mount
is read-only except a fresh tmpfs on each VOLUME of the Dockerfile (empty and
owned by the USER, like a Kubernetes emptyDir; Docker would copy the image's
folder in) and on /tmp (compose's ``tmpfs: [/tmp]``). The HEALTHCHECK command
runs in the same namespace (``nsenter``) under the same user and env.

PATH is the one deviation: it names the test venv's bin instead of the image's
(/opt/venv/bin or /usr/local/bin). The mount points (VOLUMEs, WORKDIR) are
created on this machine as empty folders where missing (a mount needs one) and
removed afterwards.
"""

from __future__ import annotations

import contextlib
import fcntl
import shlex
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from tests.packaging.dockerfile import Stage
from tests.packaging.wheel_env import InstalledWheel

MOUNTS_LOCK = Path("/var/tmp/framerelay-test-container-mounts.lock")
"""Held shared by every run while it uses the host folders its mounts need (other test
processes run containers too): the folders a run created are removed only by a run that
then gets it exclusively. An ``rmdir`` does not fail on a folder another run's private
mount namespace has a tmpfs on: it detaches that mount, and the other run loses its
volume (seen as ``ls: cannot access '/var/lib/framerelay/recordings'``)."""

SETUP = r"""
set -eu
awk '{print $5}' /proc/self/mountinfo | sort -u | while read -r target; do
  case "$target" in /proc*|/sys*|/dev*|/run*) continue ;; esac
  mount -o remount,bind,ro "$target" 2>/dev/null || true
done
mount -t tmpfs -o mode=1777,size=64m tmpfs /tmp
for v in $VOLUMES; do mount -t tmpfs -o "mode=0755,uid=$UID_,gid=$GID_,size=64m" tmpfs "$v"; done
cd "$WORKDIR"
exec setpriv --reuid "$UID_" --regid "$GID_" --clear-groups env -i "$@"
"""


@dataclass
class Container:
    proc: subprocess.Popen[bytes]
    stage: Stage
    env: dict[str, str]
    log: IO[bytes]

    def exec(self, argv: list[str], timeout_s: float = 30) -> subprocess.CompletedProcess[str]:
        """``argv`` inside this container: its mounts, user, env and workdir."""
        uid, gid = self.stage.uid_gid
        cd = f'cd {shlex.quote(self.stage.workdir)} && exec "$@"'
        return subprocess.run(
            ["nsenter", "--target", str(self.proc.pid), "--mount", "--",
             "setpriv", "--reuid", str(uid), "--regid", str(gid), "--clear-groups",
             "env", "-i", *_pairs(self.env), "/bin/sh", "-c", cd, "sh", *argv],
            capture_output=True, text=True, timeout=timeout_s,
        )  # fmt: skip

    def wait_healthy(self, timeout_s: float) -> subprocess.CompletedProcess[str]:
        """The HEALTHCHECK's last result, once it passes or at the deadline."""
        deadline = time.monotonic() + timeout_s
        while True:
            if self.proc.poll() is not None:
                raise AssertionError(f"the container exited:\n{self.output()}")
            result = self.exec(self.stage.healthcheck)
            if result.returncode == 0 or time.monotonic() > deadline:
                return result
            time.sleep(0.5)

    def output(self) -> str:
        """What the process printed so far (its last 3000 characters)."""
        self.log.flush()
        self.log.seek(0)
        return self.log.read().decode(errors="replace")[-3000:]


def _pairs(env: dict[str, str]) -> list[str]:
    return [f"{k}={v}" for k, v in env.items()]


def container_env(stage: Stage, installed: InstalledWheel, **extra: str) -> dict[str, str]:
    env = {**stage.env, "HOME": "/nonexistent", **extra}
    env["PATH"] = f"{installed.bin}:/usr/local/bin:/usr/bin:/bin"
    return env


@contextlib.contextmanager
def run(
    stage: Stage, installed: InstalledWheel, env: dict[str, str], argv: list[str] | None = None
) -> Iterator[Container]:
    """The image's process (ENTRYPOINT + CMD, or ``argv``) until the block ends."""
    uid, gid = stage.uid_gid
    with MOUNTS_LOCK.open("a") as lock:
        fcntl.flock(lock, fcntl.LOCK_SH)
        created = _mount_points([*stage.volumes, stage.workdir])
        try:
            yield from _run(stage, env, argv, uid, gid)
        finally:
            _remove_unused(lock, created)


def _remove_unused(lock: IO[str], created: list[Path]) -> None:
    """Remove the folders this run created, unless another run still uses them."""
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return
    for folder in reversed(created):
        with contextlib.suppress(OSError):
            folder.rmdir()


def _run(
    stage: Stage, env: dict[str, str], argv: list[str] | None, uid: int, gid: int
) -> Iterator[Container]:
    setup_env = {
        "PATH": "/usr/sbin:/usr/bin:/sbin:/bin",
        "VOLUMES": " ".join(stage.volumes), "UID_": str(uid), "GID_": str(gid),
        "WORKDIR": stage.workdir,
    }  # fmt: skip
    command = argv if argv is not None else stage.argv
    with (
        tempfile.TemporaryFile(dir="/var/tmp") as log,
        subprocess.Popen(
            ["unshare", "--mount", "--propagation", "private", "/bin/sh", "-c", SETUP, "setup",
             *_pairs(env), *command],
            env=setup_env, stdout=log, stderr=subprocess.STDOUT,
        ) as proc,
    ):  # fmt: skip
        try:
            yield Container(proc, stage, env, log)
        finally:
            if proc.poll() is None:
                proc.terminate()
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def _mount_points(paths: list[str]) -> list[Path]:
    """Create the missing folders of ``paths`` (a mount needs one); the ones created."""
    created: list[Path] = []
    for path in paths:
        for folder in reversed([Path(path), *Path(path).parents]):
            if not folder.exists():
                folder.mkdir()
                created.append(folder)
    return created
