"""Just enough of Dockerfile and .dockerignore syntax to test images by their contract.

``parse`` reads the final stage of a Dockerfile: USER, WORKDIR, ENV, ARG, VOLUME,
EXPOSE, HEALTHCHECK, ENTRYPOINT, CMD and the RUN text (continuations joined,
comments dropped, exec-form JSON or shell form). ``DockerIgnore`` applies the
builder's rules: patterns in order, the last match wins, ``!`` re-includes,
a pattern that matches a folder matches everything under it, ``**`` spans
folders.
"""

from __future__ import annotations

import json
import os
import re
import shlex
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path


@dataclass
class Stage:
    base: str
    user: str = "root"
    workdir: str = "/"
    env: dict[str, str] = field(default_factory=dict)
    volumes: list[str] = field(default_factory=list)
    expose: list[int] = field(default_factory=list)
    healthcheck: list[str] = field(default_factory=list)
    healthcheck_options: dict[str, str] = field(default_factory=dict)
    entrypoint: list[str] = field(default_factory=list)
    cmd: list[str] = field(default_factory=list)
    run: list[str] = field(default_factory=list)
    copy: list[str] = field(default_factory=list)
    args: dict[str, str] = field(default_factory=dict)

    @property
    def uid_gid(self) -> tuple[int, int]:
        uid, _, gid = self.user.partition(":")
        return int(uid), int(gid or uid)

    @property
    def argv(self) -> list[str]:
        return [*self.entrypoint, *self.cmd]


def instructions(text: str) -> list[tuple[str, str]]:
    """(KEYWORD, arguments) of each instruction, continuation lines joined."""
    out: list[tuple[str, str]] = []
    pending = ""
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        keyword, _, args = (pending + line).partition(" ")
        out.append((keyword.upper(), args.strip()))
        pending = ""
    return out


def _form(args: str) -> list[str]:
    """Exec form (a JSON array) as is; shell form as ``/bin/sh -c TEXT``."""
    if args.startswith("["):
        value = json.loads(args)
        return [str(v) for v in value]
    return ["/bin/sh", "-c", args]


def _expand(value: str, env: dict[str, str]) -> str:
    return re.sub(r"\$\{?(\w+)\}?", lambda m: env.get(m.group(1), ""), value)


def _healthcheck(stage: Stage, args: str) -> None:
    options, _, command = args.partition("CMD ")
    for opt in options.split():
        key, _, value = opt.lstrip("-").partition("=")
        stage.healthcheck_options[key] = value
    stage.healthcheck = _form(command.strip())


def _env(stage: Stage, args: str) -> None:
    for pair in shlex.split(args):
        key, _, value = pair.partition("=")
        stage.env[key] = _expand(value, stage.env)


def _arg(stage: Stage, args: str) -> None:
    key, _, value = shlex.split(args)[0].partition("=")
    stage.args[key] = value


def _volume(stage: Stage, args: str) -> None:
    stage.volumes += _form(args) if args.startswith("[") else args.split()


def _expose(stage: Stage, args: str) -> None:
    stage.expose += [int(p.split("/")[0]) for p in args.split()]


HANDLERS: dict[str, Callable[[Stage, str], None]] = {
    "USER": lambda stage, args: setattr(stage, "user", args),
    "WORKDIR": lambda stage, args: setattr(stage, "workdir", args),
    "ENV": _env,
    "ARG": _arg,
    "VOLUME": _volume,
    "EXPOSE": _expose,
    "HEALTHCHECK": _healthcheck,
    "ENTRYPOINT": lambda stage, args: setattr(stage, "entrypoint", _form(args)),
    "CMD": lambda stage, args: setattr(stage, "cmd", _form(args)),
    "RUN": lambda stage, args: stage.run.append(args),
    "COPY": lambda stage, args: stage.copy.append(args),
}


def parse(path: Path) -> Stage:
    """The final stage of the Dockerfile at ``path``."""
    stage = Stage(base="")
    for keyword, args in instructions(path.read_text()):
        if keyword == "FROM":
            stage = Stage(base=args.split()[0])
        elif keyword in HANDLERS:
            HANDLERS[keyword](stage, args)
    return stage


def _pattern(text: str) -> re.Pattern[str]:
    out = ""
    i = 0
    while i < len(text):
        if text.startswith("**/", i):
            out, i = out + "(?:.*/)?", i + 3
        elif text.startswith("**", i):
            out, i = out + ".*", i + 2
        elif text[i] == "*":
            out, i = out + "[^/]*", i + 1
        elif text[i] == "?":
            out, i = out + "[^/]", i + 1
        else:
            out, i = out + re.escape(text[i]), i + 1
    return re.compile(out + r"\Z")


class DockerIgnore:
    def __init__(self, text: str) -> None:
        self.rules: list[tuple[bool, re.Pattern[str]]] = []
        self.included: list[str] = []
        for raw in text.splitlines():
            line = raw.strip()
            if not line or line.startswith("#"):
                continue
            negate = line.startswith("!")
            cleaned = line.lstrip("!").strip().strip("/")
            self.rules.append((negate, _pattern(cleaned)))
            if negate:
                self.included.append(cleaned)

    def excluded(self, relpath: str) -> bool:
        parts = relpath.strip("/").split("/")
        prefixes = ["/".join(parts[: i + 1]) for i in range(len(parts))]
        result = False
        for negate, rule in self.rules:
            if any(rule.match(p) for p in prefixes):
                result = not negate
        return result

    def context(self, root: Path) -> list[str]:
        """Relative paths of the files a build of ``root`` sends (pruning excluded folders
        that no ``!`` pattern reaches into)."""
        files: list[str] = []
        for folder, dirs, names in os.walk(root):
            rel = Path(folder).relative_to(root).as_posix()
            rel = "" if rel == "." else rel + "/"
            dirs[:] = [d for d in dirs if not self._prune(rel + d)]
            files += [rel + n for n in names if not self.excluded(rel + n)]
        return files

    def _prune(self, reldir: str) -> bool:
        return self.excluded(reldir) and not any(
            inc.startswith(reldir + "/") for inc in self.included
        )
