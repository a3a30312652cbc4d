"""The demo ends on Ctrl-C and on SIGTERM as its end would: it prints its summary, removes
the console's token and stops its worker, also when it was started with SIGINT ignored
(what a script's ``framerelay demo ... &`` gives it, and what CI's background runs gave
the console test: the demo then ran on after Ctrl-C until it was killed, leaving its token
and its worker behind)."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from tests.conftest import TIMEOUT_FACTOR, service_env
from tests.support.waiting import wait_until

pytestmark = pytest.mark.integration
CONSOLE = re.compile(r"console: (\S+) \(sign in with the token in (\S+);")
IGNORING_SIGINT = (
    "import os, signal, sys; signal.signal(signal.SIGINT, signal.SIG_IGN); "
    "os.execv(sys.executable, [sys.executable, '-m', 'framerelay', *sys.argv[1:]])"
)
"""Start the CLI with SIGINT ignored, as a shell starts a background command."""


class Demo:
    def __init__(self, tmp_path: Path) -> None:
        args = ["demo", "--realtime", "--loop", "--quiet", "--console-port", "0"]
        env = {**service_env(), "TMPDIR": str(tmp_path), "PYTHONFAULTHANDLER": "1"}
        self.proc = subprocess.Popen(
            [sys.executable, "-c", IGNORING_SIGINT, *args],
            cwd=tmp_path,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,  # its worker goes with it if it must be killed
        )
        self.lines: list[str] = []
        self.token: Path | None = None
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            self.lines.append(line)
            found = CONSOLE.search(line)
            if found:
                self.token = Path(found.group(2))

    def up(self) -> bool:
        return self.token is not None and any("tunnel up" in line for line in self.lines)

    def stop(self, sig: signal.Signals) -> tuple[int | None, str]:
        """Send ``sig``; its exit code (None: it did not exit, killed) and its stdout."""
        self.proc.send_signal(sig)
        try:
            out, _ = self.proc.communicate(timeout=60 * TIMEOUT_FACTOR)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            out, _ = self.proc.communicate(timeout=10)
            return None, out
        self._reader.join(10)
        return self.proc.returncode, out


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["ctrl-c", "sigterm"])
def test_the_demo_ends_cleanly_on_a_signal_even_with_sigint_ignored(
    tmp_path: Path, sig: signal.Signals
) -> None:
    demo = Demo(tmp_path)
    try:
        wait_until(demo.up, 120, lambda: "the demo up:\n" + "".join(demo.lines[-20:]))
    except TimeoutError:
        os.killpg(demo.proc.pid, signal.SIGKILL)
        raise
    code, out = demo.stop(sig)
    said = "".join(demo.lines[-40:])
    assert code == 0, f"exit {code} after {sig.name}; stderr ends:\n{said}"
    assert "demo-1" in out  # the summary table
    assert demo.token is not None and not demo.token.exists()  # removed at the end
    assert not list(tmp_path.glob("framerelay-worker-*.log"))  # the worker exited cleanly
