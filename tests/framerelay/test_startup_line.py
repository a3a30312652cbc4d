"""The ``--announce`` ready line is one ``write(2)``: workers sharing a stdout never interleave."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from framerelay import startup

LINE = (
    "import sys; from framerelay.startup import print_ready_json as p; p({'w': sys.argv[1] * 900})"
)


def test_the_line_and_its_newline_go_in_one_write(monkeypatch: pytest.MonkeyPatch) -> None:
    r, w = os.pipe()
    writes: list[bytes] = []
    real_write = os.write

    def spy(fd: int, data: bytes) -> int:
        writes.append(bytes(data))
        return real_write(fd, data)

    with open(w, "w", buffering=1) as out:
        monkeypatch.setattr(sys, "stdout", out)
        monkeypatch.setattr(os, "write", spy)
        startup.print_ready_json({"event": "ready", "url": "ws://127.0.0.1:1/v1/tunnel"})
    assert writes == [b'{"event": "ready", "url": "ws://127.0.0.1:1/v1/tunnel"}\n']
    os.close(r)


def test_a_captured_stdout_without_a_descriptor_still_gets_the_line(
    capsys: pytest.CaptureFixture[str],
) -> None:
    startup.print_ready_json({"event": "ready"})
    assert capsys.readouterr().out == '{"event": "ready"}\n'


def test_unbuffered_writers_on_one_pipe_keep_whole_lines() -> None:
    """Eight unbuffered processes, one pipe, 2.7 KB lines: every line parses."""
    env = os.environ | {"PYTHONUNBUFFERED": "1"}
    r, w = os.pipe()
    procs = [
        subprocess.Popen([sys.executable, "-c", LINE, str(k)], stdout=w, env=env) for k in range(8)
    ]
    os.close(w)
    for proc in procs:
        assert proc.wait(60) == 0
    with open(r) as pipe:
        lines = pipe.read().splitlines()
    assert sorted(json.loads(line)["w"][0] for line in lines) == [str(k) for k in range(8)]
