"""The wheel: ``pip install .`` (not editable) ships the Hydra configs (``pkg://dmt.conf``), and
``dmt-train trainer=smoke`` then trains from any directory.

The wheel is built offline from a copy of the sources and installed into a fresh virtualenv. The
heavy dependencies (torch, torchrec, fbgemm, hydra, ...) come from this interpreter's
site-packages through a ``.pth`` file of plain path lines, which puts those directories on
``sys.path`` after the fresh venv's own site-packages without running their ``.pth`` files: an
editable dmt installed there never registers its import finder, and ``dmt`` is the wheel's.
"""

from __future__ import annotations

import importlib.metadata
import json
import math
import os
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest
import yaml

from tests.conftest import REPO

CONF = REPO / "dmt" / "conf"


def _run(args: list[str | Path], cwd: Path, timeout: float = 240) -> str:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
    done = subprocess.run(
        [str(a) for a in args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert done.returncode == 0, f"{args} failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    return done.stdout


def build_wheel(out: Path) -> Path:
    """``pip wheel`` of a copy of the sources (an in-tree build would leave ``build/`` behind),
    offline: no index, no build isolation (this interpreter's setuptools)."""
    for needed in ("pip", "setuptools"):
        try:
            importlib.metadata.version(needed)
        except importlib.metadata.PackageNotFoundError:
            pytest.skip(
                f"building a wheel offline needs {needed} in this interpreter's environment"
            )
    src = out / "src"
    src.mkdir(parents=True)
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(REPO / name, src / name)
    shutil.copytree(REPO / "dmt", src / "dmt", ignore=shutil.ignore_patterns("__pycache__"))
    _run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--no-index"]
        + ["-q", "-w", out / "dist", src],
        cwd=out,
    )
    (wheel,) = (out / "dist").glob("dmt-*.whl")
    return wheel


def fresh_venv(root: Path, wheel: Path) -> Path:
    """A virtualenv with dmt installed from ``wheel``; returns its ``bin/``."""
    _run([sys.executable, "-m", "venv", "--without-pip", root], cwd=root.parent)
    python = root / "bin" / "python"
    site_packages = Path(
        _run([python, "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"], root).strip()
    )
    deps = dict.fromkeys(sysconfig.get_path(k) for k in ("purelib", "platlib"))
    (site_packages / "dmt_test_dependencies.pth").write_text("".join(f"{d}\n" for d in deps))
    _run(
        [sys.executable, "-m", "pip", "--python", python, "install", "--no-deps", "--no-index"]
        + ["-q", wheel],
        cwd=root,
    )
    return root / "bin"


def _ships_every_config(wheel: Path) -> None:
    shipped = set(zipfile.ZipFile(wheel).namelist())
    assert "dmt/conf/config.yaml" in shipped
    every_yaml = {f"dmt/{p.relative_to(REPO / 'dmt')}" for p in CONF.rglob("*.yaml")}
    assert every_yaml <= shipped, f"the wheel misses configs: {sorted(every_yaml - shipped)}"


def test_the_wheel_ships_every_config(tmp_path):
    """The wheel's files (8 s); installing and training it runs with -m slow (below)."""
    _ships_every_config(build_wheel(tmp_path / "build"))


@pytest.mark.slow  # CI time (2 cores): 26 s, a wheel built and installed into a fresh venv
def test_the_installed_wheel_trains_from_another_directory(tmp_path):
    wheel = build_wheel(tmp_path / "build")
    _ships_every_config(wheel)

    venv = tmp_path / "venv"
    bin_dir = fresh_venv(venv, wheel)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()

    where = _run(
        [
            bin_dir / "python",
            "-c",
            "import importlib.resources, dmt; "
            "print(dmt.__file__); print(importlib.resources.files('dmt.conf'))",
        ],
        cwd=elsewhere,
    ).split()
    assert all(Path(p).is_relative_to(venv) for p in where), where

    # python -m dmt.train composes from the installed package
    job = yaml.safe_load(
        _run([bin_dir / "python", "-m", "dmt.train", "trainer=smoke", "--cfg", "job"], elsewhere)
    )
    assert job["trainer"]["max_steps"] == 2

    # the console script trains, writing its run directory under the working directory
    out = _run([bin_dir / "dmt-train", "trainer=smoke", "logger=disabled"], elsewhere)
    assert "metrics written to" in out, out
    (metrics_file,) = (elsewhere / "outputs").glob("*/*/metrics.json")
    metrics = json.loads(metrics_file.read_text())
    assert metrics["num_steps"] == 2 and math.isfinite(metrics["test_auc"])
    hydra = yaml.safe_load((metrics_file.parent / ".hydra" / "hydra.yaml").read_text())["hydra"]
    main = [s for s in hydra["runtime"]["config_sources"] if s["provider"] == "main"]
    assert main == [{"path": "dmt.conf", "schema": "pkg", "provider": "main"}], main
    assert hydra["runtime"]["cwd"] == str(elsewhere)
