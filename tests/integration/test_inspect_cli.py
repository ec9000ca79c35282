"""``python -m dmt.inspect`` (the ``dmt-inspect`` console script) never replaces an earlier run's
``inspect.json`` unless ``overwrite=true``, as ``dmt-plan`` does (:mod:`dmt.planning.run_dir`)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest


def _inspect(run_dir: Path, *overrides: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "dmt.inspect", f"hydra.run.dir={run_dir}", *overrides],
        capture_output=True,
        text=True,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
        timeout=120,
        check=False,
    )


def _texts(run_dir: Path) -> dict[str, str]:
    return {str(p.relative_to(run_dir)): p.read_text() for p in run_dir.rglob("*") if p.is_file()}


@pytest.mark.slow  # several dmt-inspect runs (about 40 s on 2 shared cores)
def test_an_earlier_inspect_json_is_replaced_only_with_overwrite(tmp_path: Path) -> None:
    """Reproduced: a second dmt-inspect into the same run directory replaced inspect.json
    without a word; one that failed its checks left the earlier inspect.json beside its own
    .hydra/ record."""
    run_dir = tmp_path / "ins"
    first = _inspect(run_dir)
    assert first.returncode == 0, first.stderr[-3000:]
    assert json.loads((run_dir / "inspect.json").read_text())["num_embedding_parameters"] > 0
    before = _texts(run_dir)
    refused = _inspect(run_dir, "model.embedding_dim=8", "model.bottom_mlp=[32,8]")
    assert refused.returncode == 1, refused.stderr[-3000:]
    assert refused.stderr == (
        f"Error: run directory {run_dir} already holds an earlier report (inspect.json); choose "
        "another hydra.run.dir (or leave it unset for a new one), or set overwrite=true to "
        "replace it\n"
    )
    assert _texts(run_dir) == before
    typo = _inspect(run_dir, "overwrite=true", "model.embedding_dim=8")
    assert typo.returncode == 1, typo.stderr[-3000:]
    assert typo.stderr.endswith(
        f"(nothing written: the earlier inspect.json in {run_dir} and its .hydra/ record are "
        "kept)\n"
    ), typo.stderr[-3000:]
    assert _texts(run_dir) == before
    # settings the model refuses are checked there too (a reproduced bug: a tower count above
    # the feature count was a traceback after Hydra wrote, and the earlier report was deleted)
    towers = _inspect(
        run_dir, "overwrite=true", "experiment=dmt_4t_dlrm", "model.partition.num_towers=30"
    )
    assert towers.returncode == 1, towers.stderr[-3000:]
    assert towers.stderr == (
        "Error: model.partition.num_towers: num_towers=30 must be an integer in [1, 26] for 26 "
        "sparse features (more towers than features would leave towers empty)\n(nothing "
        f"written: the earlier inspect.json in {run_dir} and its .hydra/ record are kept)\n"
    )
    assert _texts(run_dir) == before
    replaced = _inspect(
        run_dir, "overwrite=true", "model.embedding_dim=8", "model.bottom_mlp=[32,8]"
    )
    assert replaced.returncode == 0, replaced.stderr[-3000:]
    report = json.loads((run_dir / "inspect.json").read_text())
    earlier = json.loads(before["inspect.json"])
    assert report["num_embedding_parameters"] * 2 == earlier["num_embedding_parameters"]
