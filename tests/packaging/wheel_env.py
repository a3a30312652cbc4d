"""Build framerelay's wheel and install it in a fresh venv outside the repository.

How the venv gets its third-party packages, and why: the test must be quick
and offline-safe, and must still catch a dependency that pyproject.toml
forgets. So the venv (``python -m venv --without-pip``, no system site
packages) gets framerelay ONLY from the wheel (``pip --python VENV install
--no-deps``), and its third-party packages from a separate folder of symbolic
links to the repository .venv's installed distributions -- exactly those in
the dependency closure of the wheel's own ``Requires-Dist`` (with the extra
asked for, ``cpu``), read from the wheel's METADATA and followed through each
installed distribution's requirements. A package the code imports but the
wheel does not declare is absent there, so the run fails; nothing of the
.venv outside that closure (pytest, the dev tools, the editable framerelay)
is visible. ``--system-site-packages`` would hide such a gap; a download from
PyPI would make the test slow and network-bound.

Everything lies under /var/tmp (not /tmp: the container-contract runs mount
a fresh /tmp) in folders that uid 65534 can read.
"""

from __future__ import annotations

import email.parser
import importlib.metadata as md
import shutil
import stat
import subprocess
import sys
import sysconfig
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from tests.packaging.dockerfile import DockerIgnore

ROOT = Path(__file__).resolve().parents[2]


@dataclass(frozen=True)
class InstalledWheel:
    wheel: Path
    venv: Path
    deps: Path

    @property
    def bin(self) -> Path:
        return self.venv / "bin"

    @property
    def site(self) -> Path:
        return Path(sysconfig.get_path("purelib", vars={"base": str(self.venv)}))


def build_wheel(workdir: Path) -> Path:
    """``pip wheel`` of exactly the Docker build context (the files .dockerignore lets in),
    copied to a clean folder: what the images build from, and no stale build/ output."""
    src = workdir / "src"
    for rel in DockerIgnore((ROOT / ".dockerignore").read_text()).context(ROOT):
        (src / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / rel, src / rel)  # follows framerelay/_data's links
    out = workdir / "wheels"
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--no-build-isolation",
         "--wheel-dir", str(out), str(src)],
        check=True, capture_output=True, timeout=180,
    )  # fmt: skip
    (wheel,) = out.glob("framerelay-*.whl")
    return wheel


def install(wheel: Path, root: Path, extra: str = "cpu") -> InstalledWheel:
    """A venv at ``root/venv`` with framerelay from ``wheel`` and its deps linked in."""
    venv, deps = root / "venv", root / "deps"
    subprocess.run([interpreter(), "-m", "venv", "--without-pip", str(venv)], check=True)
    subprocess.run(
        [sys.executable, "-m", "pip", "--python", str(venv / "bin" / "python"), "install",
         "--quiet", "--no-deps", "--no-index", "--no-compile", str(wheel)],
        check=True, capture_output=True, timeout=180,
    )  # fmt: skip
    installed = InstalledWheel(wheel, venv, deps)
    deps.mkdir()
    found, missing = dependency_closure(wheel_requirements(wheel), extra, _markers(venv))
    for dist in found:
        _link_distribution(dist, deps)
    if missing:  # needed only by the venv's Python (another patch release): fetch those
        subprocess.run(
            [sys.executable, "-m", "pip", "--python", str(venv / "bin" / "python"), "install",
             "--quiet", "--no-deps", "--no-compile", "--target", str(deps), *missing],
            check=True, capture_output=True, timeout=180,
        )  # fmt: skip
    (installed.site / "framerelay-test-deps.pth").write_text(f"{deps}\n")
    for path in (root, *root.rglob("*")):  # uid 65534 reads it all, writes nothing
        if path.is_dir() and not path.is_symlink():
            path.chmod(0o755)
    return installed


def interpreter() -> str:
    """This Python's version, from an install that uid 65534 can run.

    The tests' own interpreter may live where others cannot enter (pyenv under
    /root); the system one of the same minor version runs the same cp3X wheels.
    """
    minor = f"python{sys.version_info.major}.{sys.version_info.minor}"
    base = str(getattr(sys, "_base_executable", sys.executable))
    for candidate in (base, f"/usr/bin/{minor}", f"/usr/local/bin/{minor}"):
        if Path(candidate).is_file() and _others_can_run(Path(candidate)):
            return candidate
    raise RuntimeError(f"no {minor} that uid 65534 can run (tried the tests' own and /usr/bin)")


def _others_can_run(python: Path) -> bool:
    """Every folder on the way to the real file (and its stdlib) lets others in."""
    real = python.resolve()
    stdlib = Path(sysconfig.get_path("stdlib", vars={"installed_base": str(real.parents[1])}))
    paths = [real, *real.parents, *stdlib.parents]
    return all(p.stat().st_mode & stat.S_IXOTH for p in paths if p.exists())


def wheel_requirements(wheel: Path) -> list[str]:
    with zipfile.ZipFile(wheel) as zf:
        name = next(n for n in zf.namelist() if n.endswith(".dist-info/METADATA"))
        meta = email.parser.Parser().parsestr(zf.read(name).decode())
    return meta.get_all("Requires-Dist") or []


def _markers(venv: Path) -> dict[str, str]:
    """The marker values of the venv's Python that may differ from this one's."""
    code = "import platform; print(platform.python_version())"
    out = subprocess.run(
        [str(venv / "bin" / "python"), "-c", code], check=True, capture_output=True, text=True
    ).stdout.strip()
    return {"python_full_version": out, "python_version": ".".join(out.split(".")[:2])}


def dependency_closure(
    requirements: list[str], extra: str, markers: dict[str, str]
) -> tuple[list[md.Distribution], list[str]]:
    """(this interpreter's installed distributions that ``requirements[extra]`` pull in on a
    Python with ``markers``, requirements that none of them satisfies)."""
    todo = [(Requirement(r), extra) for r in requirements]
    walked: set[tuple[str, frozenset[str]]] = set()
    found: dict[str, md.Distribution] = {}
    missing: list[str] = []
    while todo:
        req, ext = todo.pop()
        if req.marker is not None and not req.marker.evaluate({**markers, "extra": ext}):
            continue
        key = (canonicalize_name(req.name), frozenset(req.extras))
        if key in walked:
            continue
        walked.add(key)
        try:
            dist = md.distribution(req.name)
        except md.PackageNotFoundError:
            missing.append(str(Requirement(f"{req.name}{req.specifier}")))
            continue
        found[key[0]] = dist
        todo += [(Requirement(r), e) for r in dist.requires or [] for e in ("", *req.extras)]
    return list(found.values()), missing


def _link_distribution(dist: md.Distribution, deps: Path) -> None:
    base = Path(str(dist.locate_file("")))
    tops = {Path(str(f)).parts[0] for f in dist.files or []}
    for top in tops:
        src = base / top
        if top.endswith(".pth") or top == ".." or not src.exists():
            continue  # scripts (../../bin) and .pth hooks are not packages
        dst = deps / top
        if dst.exists():
            continue
        if Path("/tmp") in src.resolve().parents:
            # a checkout under /tmp: the containers mount a fresh tmpfs there, which would
            # hide a link's target, so this one is copied
            if src.is_dir():
                shutil.copytree(src, dst, symlinks=True)
            else:
                shutil.copy2(src, dst)
        else:
            dst.symlink_to(src)


def workspace() -> Path:
    """A fresh folder under /var/tmp that others can traverse."""
    root = Path(tempfile.mkdtemp(prefix="framerelay-wheel-", dir="/var/tmp"))
    root.chmod(0o755)
    return root


def readonly_dir(root: Path, name: str) -> Path:
    """An unrelated directory uid 65534 can enter but not write."""
    d = root / f"elsewhere-{name}"
    d.mkdir()
    d.chmod(0o555)
    return d


def nobody(args: list[str]) -> list[str]:
    """``args`` run as uid/gid 65534 with no supplementary groups."""
    return ["setpriv", "--reuid", "65534", "--regid", "65534", "--clear-groups", *args]


def clean_env(installed: InstalledWheel, **extra: str) -> dict[str, str]:
    """No inherited PYTHONPATH or FRAMERELAY_*: only the venv's bin on PATH."""
    env = {
        "PATH": f"{installed.bin}:/usr/local/bin:/usr/bin:/bin",
        "HOME": "/nonexistent",
        "LANG": "C.UTF-8",
    }
    env.update(extra)
    return env
