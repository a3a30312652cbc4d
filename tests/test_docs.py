"""The README and docs/ stay true: settings, commands, links and the MkDocs build.

The configuration reference (docs/configuration.md) is checked against the
settings models; every command block is run by a test or marked illustrative;
the site builds with ``mkdocs build --strict`` (see docs/development.md).
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
from pathlib import Path

import pytest
from pydantic import BaseModel

from deploy.settings import (
    KubernetesSettings,
    LocalSettings,
    OrchestratorSettings,
    RunPodSettings,
    TierConfig,
    Window,
)
from framerelay.cli import build_parser
from gpu_worker.detectors.base import OnnxDetectorSettings
from gpu_worker.settings import WorkerSettings
from ingest.recording.settings import RecorderSettings
from ingest.settings import IngestSettings, ResultsSettings, StreamConfig
from tests.conftest import ROOT

DOCS = ROOT / "docs"
README = (ROOT / "README.md").read_text(encoding="utf-8")
CONFIG = (DOCS / "configuration.md").read_text(encoding="utf-8")
PAGES = sorted(DOCS.glob("*.md"))
COMMAND_LANGS = {"sh", "bash", "console", "shell", "zsh"}
TESTED = re.compile(r"<!-- tested: (tests/[\w/]+\.py) -->")
ILLUSTRATIVE = re.compile(r"<!-- illustrative: \S.* -->")


def _names(model: type[BaseModel], prefix: str) -> list[str]:
    skip = {
        "token_secrets",
        "signing_keys",
        "detector",
        "type",
        "runpod",
        "local",
        "kubernetes",
        "results",
    }
    return [prefix + n.upper() if prefix else n for n in model.model_fields if n not in skip]


@pytest.mark.parametrize(
    "name",
    _names(WorkerSettings, "FRAMERELAY_WORKER_")
    + _names(OnnxDetectorSettings, "FRAMERELAY_WORKER_DETECTOR__")
    + _names(IngestSettings, "FRAMERELAY_INGEST_")
    + _names(StreamConfig, "")
    + _names(ResultsSettings, "FRAMERELAY_INGEST_RESULTS__")
    + [
        n
        for n in _names(RecorderSettings, "FRAMERELAY_RECORD_")
        if n != "FRAMERELAY_RECORD_REDIS_URL"
    ]
    + _names(OrchestratorSettings, "FRAMERELAY_ORCH_")
    + _names(RunPodSettings, "FRAMERELAY_ORCH_RUNPOD__")
    + _names(LocalSettings, "FRAMERELAY_ORCH_LOCAL__")
    + _names(KubernetesSettings, "FRAMERELAY_ORCH_KUBERNETES__")
    + _names(TierConfig, "")
    + _names(Window, ""),
)
def test_every_setting_is_documented(name: str) -> None:
    short = name.replace("_TLS_KEY", "_TLS_CERT").replace("_TLS_CLIENT_KEY", "_TLS_CLIENT_CERT")
    short = short.replace("_API_PORT", "_API_HOST").replace("read_timeout_s", "open_timeout_s")
    short = short.replace("RECORD_READ_TIMEOUT_S", "RECORD_OPEN_TIMEOUT_S")
    assert f"`{name}`" in CONFIG or f"`{short}`" in CONFIG, f"{name} missing from configuration.md"


def test_readme_gives_exactly_the_two_setup_commands() -> None:
    quick = README.split("## Quick start", 1)[1].split("##", 1)[0]
    block = quick.split("```sh", 1)[1].split("```", 1)[0]
    commands = [line.split("#")[0].strip() for line in block.strip().splitlines()]
    assert commands == ["make demo", "make test"]
    ci = (ROOT / ".ci" / "run").read_text(encoding="utf-8")
    assert "make test" in ci


def command_blocks(path: Path) -> list[tuple[int, str]]:
    """(line number, the line before it) of every fenced command block in ``path``."""
    lines = path.read_text(encoding="utf-8").splitlines()
    found: list[tuple[int, str]] = []
    fence = False
    for i, line in enumerate(lines):
        if not line.startswith("```"):
            continue
        if not fence and line[3:].split(" ", 1)[0].strip() in COMMAND_LANGS:
            found.append((i + 1, lines[i - 1] if i else ""))
        fence = not fence
    return found


@pytest.mark.parametrize("path", [ROOT / "README.md", *PAGES], ids=lambda p: p.name)
def test_every_command_block_is_tested_or_illustrative(path: Path) -> None:
    for line, before in command_blocks(path):
        where = f"{path.relative_to(ROOT)}:{line}"
        tested = TESTED.fullmatch(before.strip())
        if tested is None:
            assert ILLUSTRATIVE.fullmatch(before.strip()), (
                f"{where}: a command block no test runs; mark it <!-- illustrative: why --> "
                "or <!-- tested: tests/FILE.py --> on the line before"
            )
            continue
        test = ROOT / tested.group(1)
        assert test.is_file(), f"{where}: {tested.group(1)} does not exist"
        assert path.name in test.read_text(encoding="utf-8"), f"{where}: {test} never reads it"


def test_blocks_are_found() -> None:
    """The enumeration itself works: the security guide's blocks are run, not just marked."""
    security = command_blocks(DOCS / "security.md")
    assert len(security) >= 2
    assert all("tests/test_security_docs.py" in before for _, before in security)


def test_docs_build_strict(tmp_path: Path) -> None:
    """docs/development.md's build command, as written, into a temporary site directory."""
    text = (DOCS / "development.md").read_text(encoding="utf-8")
    block = text.split("<!-- tested: tests/test_docs.py -->\n```sh\n", 1)[1].split("```", 1)[0]
    command = block.strip().split()
    assert command[:4] == [".venv/bin/mkdocs", "build", "--strict", "--site-dir"]
    argv = [sys.executable, "-m", "mkdocs", *command[1:4], str(tmp_path / "site")]
    proc = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=120, check=False)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-3000:]
    assert "WARNING" not in out, out[-3000:]
    assert (tmp_path / "site" / "configuration" / "index.html").is_file()


def test_readme_maps_every_page() -> None:
    index = (DOCS / "index.md").read_text(encoding="utf-8")
    for page in PAGES:
        if page.name != "index.md":
            assert f"](docs/{page.name})" in README, f"README does not link docs/{page.name}"
            assert f"]({page.name})" in index, f"docs/index.md does not link {page.name}"


@pytest.mark.parametrize("path", [ROOT / "README.md", *PAGES], ids=lambda p: p.name)
def test_no_link_leaves_the_repository(path: Path) -> None:
    text = path.read_text(encoding="utf-8")
    assert "shared/design" not in text
    for target in re.findall(r"\]\(([^)\s]+)\)", text):
        if target.startswith(("http://", "https://", "#")):
            continue
        base = path.parent
        resolved = (base / target.split("#", 1)[0]).resolve()
        assert resolved.is_relative_to(ROOT), f"{path.name} links {target}, outside the repository"
        assert resolved.exists(), f"{path.name} links {target}, which does not exist"


def _commands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    """A parser's sub-commands by name, aliases left out."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            names = [choice.dest for choice in action._choices_actions]
            return {name: action.choices[name] for name in names}
    return {}


def test_cli_reference_lists_every_command() -> None:
    cli = (DOCS / "cli.md").read_text(encoding="utf-8")
    commands = _commands(build_parser())
    assert "demo" in commands
    for name, parser in commands.items():
        assert f"`framerelay {name}`" in cli, f"framerelay {name} missing from docs/cli.md"
        row = cli.split(f"`framerelay {name}`", 1)[1].split("\n", 1)[0]
        for verb in _commands(parser):
            assert f"`{verb}`" in row, f"framerelay {name} {verb} missing from docs/cli.md"


REPO_PATH = re.compile(
    r"`([A-Za-z_.][\w.-]*/[\w./-]*\.(?:py|md|yaml|yml|toml|json|Dockerfile|onnx|mp4))`"
)


@pytest.mark.parametrize("path", [ROOT / "README.md", *PAGES], ids=lambda p: p.name)
def test_named_repository_files_exist(path: Path) -> None:
    """A file the docs name (`ingest/settings.py`) is still there: moved code moves its docs."""
    for name in REPO_PATH.findall(path.read_text(encoding="utf-8")):
        assert (ROOT / name).exists() or (DOCS / name).exists(), f"{path.name} names {name}"
