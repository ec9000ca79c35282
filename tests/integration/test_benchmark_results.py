"""A benchmark refuses an earlier run's results file when it starts, before any work, and a
median of fewer than 3 runs unless asked for a smoke run."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import REPO


def _run(script: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(script), *args],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=120,
    )


def _refusal(script: str, option: str, path: Path) -> str:
    return (
        f"{script}: error: {option} {path} exists already (an earlier run's results); choose "
        "another file, or pass --overwrite to replace it"
    )


@pytest.mark.parametrize(
    "bench",
    ["bench_sptt", "bench_torchrec_dlrm", "bench_checkpoint", "ns3_crosscheck", "bench_preprocess"],
)
def test_a_benchmark_refuses_an_earlier_runs_results_before_it_runs(tmp_path, bench):
    earlier = tmp_path / "earlier.json"
    earlier.write_text('{"earlier": true}\n')
    done = _run(REPO / "benchmarks" / f"{bench}.py", "--json", str(earlier))
    assert done.returncode == 2, done.stderr
    assert done.stderr.strip().endswith(_refusal(f"{bench}.py", "--json", earlier))
    assert earlier.read_text() == '{"earlier": true}\n'


def test_bench_preprocess_refuses_an_earlier_runs_results_in_its_workdir(tmp_path):
    """Without --json the results go to <workdir>/results.json: a second run into the same
    workdir is refused at once (a missing --sample would be the next error)."""
    earlier = tmp_path / "results.json"
    earlier.write_text('{"earlier": true}\n')
    done = _run(
        REPO / "benchmarks" / "bench_preprocess.py",
        "--workdir",
        str(tmp_path),
        "--sample",
        str(tmp_path / "no_such_sample.tsv"),
    )
    assert done.returncode == 2, done.stderr
    assert done.stderr.strip().endswith(_refusal("bench_preprocess.py", "--json", earlier))
    assert earlier.read_text() == '{"earlier": true}\n'
    assert sorted(p.name for p in tmp_path.iterdir()) == ["results.json"]  # nothing built


def test_ns3_crosscheck_writes_the_repositorys_file_by_default_from_anywhere():
    """The default --json is the repository's committed file, however the command is started:
    from another directory it is still found, and refused without --overwrite."""
    script = REPO / "benchmarks" / "ns3_crosscheck.py"
    committed = REPO / "benchmarks" / "results" / "ns3_crosscheck.json"
    before = committed.read_bytes()
    done = subprocess.run(
        [sys.executable, str(script)],
        capture_output=True,
        text=True,
        cwd="/",
        env={**os.environ, "PYTHONPATH": str(REPO)},
        timeout=120,
    )
    assert done.returncode == 2, done.stderr
    assert done.stderr.strip().endswith(_refusal("ns3_crosscheck.py", "--json", committed))
    assert committed.read_bytes() == before


@pytest.mark.parametrize(
    "script",
    [
        "benchmarks/bench_train_throughput.py",
        "benchmarks/bench_pipeline.py",
        "benchmarks/bench_criteo_loader.py",
        "benchmarks/bench_checkpoint.py",
        "benchmarks/bench_synthetic.py",
        "benchmarks/bench_preprocess.py",
        "benchmarks/bench_sptt.py",
        "benchmarks/bench_torchrec_dlrm.py",
        "scripts/bench_partitioner.py",
    ],
)
def test_a_benchmark_refuses_fewer_than_three_runs_unless_a_smoke_run(script, capsys, monkeypatch):
    monkeypatch.setattr(sys, "argv", [script])  # argparse names the program after argv[0]
    with pytest.raises(SystemExit) as exit_:
        _load(REPO / script).main(["--runs", "2"])
    assert exit_.value.code == 2
    assert (
        capsys.readouterr()
        .err.strip()
        .endswith(
            f"{Path(script).name}: error: --runs 2: a median of fewer than 3 runs is not a result "
            "(pass --smoke, with --runs 1 or more, to only check that the script runs)"
        )
    )


def test_bench_sptt_takes_each_launchers_ranks_as_one_host(capsys, monkeypatch):
    """Under netns_throttle.sh (--nnodes H, one namespace per launcher) --local-world-size
    defaulted to 2 whatever the namespaces held: with 4 ranks per namespace, traffic on a
    namespace's loopback was counted as crossing hosts."""
    bench = _load(REPO / "benchmarks" / "bench_sptt.py")
    common = ["--world-size", "8", "--nnodes", "2", "--init-file", "/tmp/x"]
    assert bench._parse(common).local_world_size == 4
    assert bench._parse([*common, "--local-world-size", "4"]).local_world_size == 4
    monkeypatch.setattr(sys, "argv", ["bench_sptt.py"])
    with pytest.raises(SystemExit):
        bench._parse([*common, "--local-world-size", "2"])
    assert (
        capsys.readouterr()
        .err.strip()
        .endswith(
            "bench_sptt.py: error: --local-world-size 2 with --nnodes 2: each launcher's 4 ranks are "
            "one host (its own network namespace), so hosts of another size would count loopback "
            "traffic as crossing hosts; leave it unset or give 4"
        )
    )


def _load(path: Path) -> Any:
    """A benchmark script as a module (in this process: no interpreter start per script)."""
    spec = importlib.util.spec_from_file_location(path.stem, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def test_bench_pipeline_leaves_the_first_log_interval_out(tmp_path):
    """The first interval holds the pipeline's fx tracing: the rate is the later intervals'
    samples over their time (each interval's rate weighted by its steps); evaluations skipped."""
    bench = _load(REPO / "benchmarks" / "bench_pipeline.py")
    records = [
        {"step": 50, "train/loss": 0.7, "train/lr": [0.1], "train/samples_per_s": 10.0},
        {"step": 100, "train/loss": 0.6, "train/lr": [0.1], "train/samples_per_s": 200.0},
        {"step": 100, "val/auc": 0.7},
        {"step": 150, "train/loss": 0.5, "train/lr": [0.1], "train/samples_per_s": 400.0},
    ]
    (tmp_path / "history.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    assert bench.post_warmup_rate(tmp_path) == pytest.approx(100 / (50 / 200 + 50 / 400))
    (tmp_path / "history.jsonl").write_text(json.dumps(records[0]) + "\n")
    assert bench.post_warmup_rate(tmp_path) is None


@pytest.mark.parametrize(
    ("script", "argv", "message"),
    [
        ("benchmarks/bench_sptt.py", ["--iters", "0"], "--iters must be at least 1"),
        ("benchmarks/bench_sptt.py", ["--trace-steps", "0"], "--trace-steps must be at least 1"),
        ("benchmarks/bench_torchrec_dlrm.py", ["--warmup", "-1"], "--warmup must be at least 0"),
        ("benchmarks/bench_torchrec_dlrm.py", ["--block", "0"], "--block must be at least 1"),
        (
            "benchmarks/bench_torchrec_dlrm.py",
            ["--variants", "reference,dmt"],
            "--variants: 'dmt' not among ['reference', 'dmt default', 'dmt pipelined', 'dmt sync']",
        ),
        (
            "benchmarks/bench_torchrec_dlrm.py",
            ["--variants", "dmt default, dmt default"],
            "--variants 'dmt default, dmt default' names a variant twice",
        ),
    ],
)
def test_a_benchmark_refuses_counts_out_of_range(script, argv, message, capsys, monkeypatch):
    """bench_torchrec_dlrm took --steps 0 or --block 0 and failed later (a median of nothing,
    or a loop that never ends its rounds)."""
    monkeypatch.setattr(sys, "argv", [script])
    with pytest.raises(SystemExit):
        _load(REPO / script).main(argv)
    assert capsys.readouterr().err.strip().endswith(f"{Path(script).name}: error: {message}")
