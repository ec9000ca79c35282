"""``python -m dmt.planning.app`` (the ``dmt-plan`` console script) writes ``plan.json`` in its
Hydra run directory with the figures the issue names, and prints its table; it never writes over
a training run's directory, nor over an earlier plan unless ``overwrite=true``."""

from __future__ import annotations

import fcntl
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from dmt.planning.run_dir import check_plan_dir

SMALL = [
    "data.synthetic.num_sparse=8",
    "data.synthetic.cardinality=100",
    "data.batch_size=64",
    "cluster.hosts=2",
    "cluster.gpus_per_host=2",
]


def _plan(run_dir: Path, *overrides: str) -> subprocess.CompletedProcess[str]:
    return _plan_cli(*SMALL, f"hydra.run.dir={run_dir}", *overrides)


def _sweep(sweep_dir: Path) -> subprocess.CompletedProcess[str]:
    return _plan_cli("-m", *SMALL, f"hydra.sweep.dir={sweep_dir}")


def _plan_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "dmt.planning.app", *args],
        capture_output=True,
        text=True,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
        timeout=300,
        check=False,
    )


def _earlier_run(run_dir: Path, *outputs: str) -> dict[str, str]:
    """A run directory with Hydra's record and ``outputs`` (path -> marker text); returns every
    file's text."""
    files = {".hydra/config.yaml": "earlier: run\n", ".hydra/overrides.yaml": "[]\n"}
    files.update({o: f"earlier {o}\n" for o in outputs})
    for name, text in files.items():
        (run_dir / name).parent.mkdir(parents=True, exist_ok=True)
        (run_dir / name).write_text(text)
    return files


def _texts(run_dir: Path) -> dict[str, str]:
    return {str(p.relative_to(run_dir)): p.read_text() for p in run_dir.rglob("*") if p.is_file()}


@pytest.mark.slow  # five dmt-plan runs (about 50 s on 2 shared cores)
def test_dmt_plan_writes_plan_json_and_replaces_it_only_with_overwrite(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    result = _plan(run_dir)
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads((run_dir / "plan.json").read_text())
    for mode in ("flat", "sptt", "dmt"):
        figures = report["modes"][mode]
        assert figures["cross_host_mb"] > 0 and figures["intra_host_mb"] >= 0
        assert 0 < figures["max_rank_memory_gb"] < 80
        line = f"{mode:5s} {figures['intra_host_mb']:14.3f} {figures['cross_host_mb']:14.3f}"
        assert line in result.stdout
    assert f"written to {run_dir / 'plan.json'}" in result.stdout
    # a second plan into the same directory stops before Hydra writes anything there
    (run_dir / "plan.json").write_text('{"earlier": true}\n')
    before = _texts(run_dir)
    refused = _plan(run_dir)
    assert refused.returncode == 1, refused.stderr[-3000:]
    assert (
        f"Error: run directory {run_dir} already holds an earlier plan (plan.json); choose "
        "another hydra.run.dir (or leave it unset for a new one), or set overwrite=true"
    ) in refused.stderr
    assert _texts(run_dir) == before
    replaced = _plan(run_dir, "overwrite=true")
    assert replaced.returncode == 0, replaced.stderr[-3000:]
    assert json.loads((run_dir / "plan.json").read_text())["world_size"] == 4
    # a replacing plan whose settings fail their checks stops before Hydra writes (a mistyped
    # setting: test_a_replacing_plan_whose_settings_fail_keeps_the_earlier_plan_and_record); so
    # does a layout SPTT cannot shard (a reproduced bug: a traceback after Hydra wrote, and the
    # earlier plan deleted)
    before = _texts(run_dir)
    rows = _plan(run_dir, "overwrite=true", "sptt.sharding_type=row_wise",
                 "data.synthetic.cardinality=1")  # fmt: skip
    assert rows.returncode == 1, rows.stderr[-3000:]
    assert rows.stderr == (
        "Error: sptt: sptt.sharding_type=row_wise puts a row block of every table on each of the "
        "K*L=2 ranks of its tower (sptt.hosts_per_tower=1, L=2 ranks per host "
        "(cluster.gpus_per_host=2)), but the table of feature cat_0 has 1 row "
        "(data.synthetic.cardinality=1): a row-wise table needs at least 2 rows; give it more, "
        "or use sptt.sharding_type=table_wise or column_wise"
        f"\n(nothing written: the earlier plan.json in {run_dir} and its .hydra/ record are "
        "kept)\n"
    )
    assert _texts(run_dir) == before
    # tables that fit no budget are found by the settings' checks too: nothing written
    tables = _plan(run_dir, "overwrite=true", "cluster.gpu_memory_gb=0.0000001")
    assert tables.returncode == 1, tables.stderr[-3000:]
    assert "raise cluster.gpu_memory_gb or set sharding.hbm_gb" in tables.stderr
    assert tables.stderr.endswith("and its .hydra/ record are kept)\n"), tables.stderr[-3000:]
    assert _texts(run_dir) == before
    # a replacing plan that fails while planning (here the activations of a large batch) leaves
    # no plan.json of other settings beside its own .hydra/ (a reproduced bug: the earlier plan
    # stayed, paired with the failed run's config), and says why in one line
    failed = _plan(run_dir, "overwrite=true", "data.batch_size=1048576", "cluster.gpu_memory_gb=1")
    assert failed.returncode == 1, failed.stderr[-3000:]
    assert failed.stderr.startswith("Error: sptt: rank 0 needs "), failed.stderr[-3000:]
    assert len(failed.stderr.strip().splitlines()) == 1, failed.stderr[-3000:]
    assert "data.batch_size=1048576" in (run_dir / ".hydra" / "overrides.yaml").read_text()
    assert not (run_dir / "plan.json").exists()


# CI time (2 cores): two dmt-plan processes (5 s; the refusal before writing is the case above's)
@pytest.mark.slow
def test_a_replacing_plan_whose_settings_fail_keeps_the_earlier_plan_and_record(
    tmp_path: Path,
) -> None:
    """The suite's share of the slow test above (one dmt-plan run): a reproduced bug,
    ``overwrite=true`` deleted the earlier plan before the new settings were checked."""
    run_dir = tmp_path / "run"
    before = _earlier_run(run_dir, "plan.json")
    typo = _plan(run_dir, "overwrite=true", "sptt.comm_precision=fp8")
    assert typo.returncode == 1, typo.stderr[-3000:]
    assert typo.stderr.startswith(
        "Error: sptt.comm_precision='fp8' is not supported; expected one of ['fp32', 'bf16', "
        f"'fp16']\n(nothing written: the earlier plan.json in {run_dir} and its .hydra/ record "
        "are kept)"
    ), typo.stderr[-3000:]
    assert _texts(run_dir) == before


def test_a_plans_bad_setting_leaves_no_run_directory(tmp_path: Path) -> None:
    """Reproduced bug: a mistyped setting of a new plan ended in a traceback after Hydra had made
    the run directory (``.hydra/`` and an empty ``app.log`` of a plan that never started)."""
    run_dir = tmp_path / "run"
    typo = _plan(run_dir, "+cluster.hostz=64")
    assert typo.returncode == 1, typo.stderr[-3000:]
    assert typo.stderr == (
        "Error: cluster.hostz is not a setting of ClusterConfig (a + override adds keys only "
        "where the config takes any key, e.g. optim.sparse); did you mean cluster.hosts?\n"
    )
    assert not run_dir.exists()


def test_a_training_runs_directory_is_refused_even_with_overwrite(tmp_path: Path) -> None:
    """The guard in process (the CLI runs it before Hydra writes: the tests above and below)."""
    run_dir = tmp_path / "train"
    before = _earlier_run(run_dir, "metrics.json", "checkpoints/step_10/.metadata")
    for overwrite in (False, True):
        with pytest.raises(
            ValueError,
            match=rf"^run directory {run_dir} holds a training run's outputs \(metrics.json, .*"
            r"choose another hydra.run.dir",
        ):
            check_plan_dir(run_dir, overwrite=overwrite)
    assert _texts(run_dir) == before


def test_a_live_runs_directory_is_refused(tmp_path: Path) -> None:
    run_dir = tmp_path / "live"
    _earlier_run(run_dir, "run.lock")
    fd = os.open(run_dir / "run.lock", os.O_RDWR)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # as a training run's rank 0 holds it
        with pytest.raises(ValueError, match=r"\(run.lock, held by a live run\)"):
            check_plan_dir(run_dir, overwrite=True)
    finally:
        os.close(fd)
    check_plan_dir(run_dir, overwrite=False)  # released: a stale lock file alone is no run


@pytest.mark.slow  # three dmt-plan CLI runs (24-45 s on 2 shared cores; CI time)
def test_a_file_where_the_run_directory_or_plan_json_goes_is_refused(tmp_path: Path) -> None:
    """Reproduced bugs: a ``hydra.run.dir`` (or ``hydra.sweep.dir``) where a file is, or under
    one, ended in a FileExistsError / NotADirectoryError traceback; a directory named
    ``plan.json`` in the run directory, with ``overwrite=true``, in an IsADirectoryError
    traceback after planning."""
    afile = tmp_path / "afile"
    afile.write_text("a user's file\n")
    result = _plan(afile)
    assert result.returncode == 1, result.stderr[-3000:]
    assert result.stderr == (
        f"Error: run directory {afile}: {afile} is not a directory; choose another "
        "hydra.run.dir (or leave it unset for a new one)\n"
    )
    with pytest.raises(ValueError, match=rf"^run directory {afile / 'run'}: {afile} is not a"):
        check_plan_dir(afile / "run", overwrite=False)
    run_dir = tmp_path / "run"
    (run_dir / "plan.json").mkdir(parents=True)
    result = _plan(run_dir, "overwrite=true")
    assert result.returncode == 1, result.stderr[-3000:]
    assert result.stderr == (
        f"Error: run directory {run_dir} holds {run_dir / 'plan.json'}, which is not a "
        "regular file as dmt-plan writes there: not replaced, even with overwrite=true; "
        "choose another hydra.run.dir (or leave it unset for a new one)\n"
    )
    with pytest.raises(ValueError, match="which is not a regular file as dmt-plan writes there"):
        check_plan_dir(run_dir, overwrite=False)
    assert [p.name for p in run_dir.iterdir()] == ["plan.json"]  # no .hydra/ either
    sweep_dir = afile / "sweep"
    result = _sweep(sweep_dir)
    assert result.returncode == 1, result.stderr[-3000:]
    assert result.stderr == (
        f"Error: sweep directory {sweep_dir}: {afile} is not a directory; choose another "
        "hydra.sweep.dir (or leave it unset for a new one)\n"
    )
    assert afile.read_text() == "a user's file\n"


@pytest.mark.slow  # two dmt-plan sweeps (9-17 s on 2 shared cores; CI time)
def test_a_sweep_over_an_earlier_sweeps_plans_is_refused(tmp_path: Path) -> None:
    sweep_dir = tmp_path / "sweep"
    before = _earlier_run(sweep_dir / "0", "plan.json")
    result = _sweep(sweep_dir)
    assert result.returncode == 1, result.stderr[-3000:]
    assert (
        f"Error: sweep directory {sweep_dir}: run directory {sweep_dir / '0'} already holds an "
        "earlier plan (plan.json); choose another hydra.sweep.dir"
    ) in result.stderr
    assert _texts(sweep_dir / "0") == before
    assert sorted(p.name for p in sweep_dir.iterdir()) == ["0"]  # no multirun.yaml either
