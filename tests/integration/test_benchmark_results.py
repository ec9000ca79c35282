"""A benchmark refuses an earlier run's results file when it starts, before any work, and a
median of fewer than 3 runs unless asked for a smoke run; bad arguments and Hydra overrides are
one-line errors (exit 2) before any work, and a failed run leaves nothing of its own behind."""

from __future__ import annotations

import gzip
import importlib.util
import json
import logging
import os
import shutil
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

from tests.conftest import REPO, typed_config


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
    # CI time (2 cores): bench_sptt's, bench_torchrec_dlrm's and bench_checkpoint's (11, 7 and 6 s, the same
    # existing_output check as the others) run with -m slow
    [
        pytest.param("bench_sptt", marks=pytest.mark.slow),
        pytest.param("bench_torchrec_dlrm", marks=pytest.mark.slow),
        pytest.param("bench_checkpoint", marks=pytest.mark.slow),
        "ns3_crosscheck",
        "bench_preprocess",
    ],
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


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--modes", "flat,dmt,flat"], "--modes 'flat,dmt,flat' names ['flat'] twice"),
        (["--peer-permute", "skip,skip"], "--peer-permute 'skip,skip' names ['skip'] twice"),
        (["--pipeline", "on,on"], "--pipeline 'on,on' names ['on'] twice"),
        (
            ["--comm-precision", "bf16,fp32,bf16"],
            "--comm-precision 'bf16,fp32,bf16' names ['bf16'] twice",
        ),
    ],
)
def test_bench_sptt_refuses_a_setting_named_twice(argv, message, capsys, monkeypatch):
    """``--modes flat,flat`` built two variants of one name, whose step times went into one
    list: both records said "median of 3 runs" over 6 run medians, the two variants' pooled."""
    bench = _load(REPO / "benchmarks" / "bench_sptt.py")
    monkeypatch.delenv("RANK", raising=False)
    monkeypatch.setattr(sys, "argv", ["bench_sptt.py"])
    with pytest.raises(SystemExit):
        bench._parse(argv)
    assert (
        capsys.readouterr()
        .err.strip()
        .endswith(f"bench_sptt.py: error: {message}; give each setting once")
    )


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (
            ["--local-world-size", "3"],
            "torchrun's WORLD_SIZE 4 must be a multiple of --local-world-size 3 (ranks per "
            "emulated host)",
        ),
        (
            ["--local-world-size", "2", "--hosts-per-tower", "3"],
            "torchrun's WORLD_SIZE 4 is 2 hosts of --local-world-size 2: not a multiple of "
            "--hosts-per-tower 3 (every tower spans K whole hosts)",
        ),
    ],
)
def test_bench_sptt_under_torchrun_checks_the_hosts_of_its_world(
    argv, message, capsys, monkeypatch
):
    """Under torchrun (``--nproc-per-node 4``) these were not checked: every rank failed
    inside with Topology's ValueError, a traceback each."""
    bench = _load(REPO / "benchmarks" / "bench_sptt.py")
    for name, value in {"RANK": "0", "WORLD_SIZE": "4", "LOCAL_WORLD_SIZE": "4"}.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setattr(sys, "argv", ["bench_sptt.py"])
    with pytest.raises(SystemExit):
        bench._parse(argv)
    assert capsys.readouterr().err.strip().endswith(f"bench_sptt.py: error: {message}")
    assert bench._parse(["--local-world-size", "2"]).local_world_size == 2  # 2 hosts of 2


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
            "--variants: 'dmt' not among ['reference', 'reference fused', 'dmt default', "
            "'dmt pipelined', 'dmt sync', 'dmt unfused']",
        ),
        (
            "benchmarks/bench_torchrec_dlrm.py",
            ["--variants", "dmt default, dmt default"],
            "--variants 'dmt default, dmt default' names a variant twice",
        ),
        (
            "benchmarks/bench_torchrec_dlrm.py",
            ["--threads", "-3"],
            "--threads -3: must be 0 (torch's default) or more",
        ),
        ("benchmarks/bench_sptt.py", ["--world-size", "0"], "--world-size must be at least 1"),
        ("benchmarks/bench_sptt.py", ["--world-size", "-2"], "--world-size must be at least 1"),
        ("benchmarks/bench_sptt.py", ["--nnodes", "0"], "--nnodes must be at least 1"),
        ("benchmarks/bench_sptt.py", ["--batch", "0"], "--batch must be at least 1"),
        (
            "benchmarks/bench_sptt.py",
            ["--world-size", "3", "--local-world-size", "2"],
            "--world-size 3 must be a multiple of --local-world-size 2 (ranks per emulated host)",
        ),
        (
            "benchmarks/bench_sptt.py",
            ["--world-size", "4", "--local-world-size", "2", "--hosts-per-tower", "3"],
            "--world-size 4 is 2 hosts of --local-world-size 2: not a multiple of "
            "--hosts-per-tower 3 (every tower spans K whole hosts)",
        ),
    ],
)
def test_a_benchmark_refuses_counts_out_of_range(script, argv, message, capsys, monkeypatch):
    """bench_torchrec_dlrm took --steps 0 or --block 0 and failed later (a median of nothing,
    or a loop that never ends its rounds); bench_sptt --world-size 0 started no rank and exited
    0, --world-size 3 failed inside the ranks, and --threads -3 was taken as torch's default."""
    monkeypatch.delenv("RANK", raising=False)
    monkeypatch.setattr(sys, "argv", [script])
    with pytest.raises(SystemExit):
        _load(REPO / script).main(argv)
    assert capsys.readouterr().err.strip().endswith(f"{Path(script).name}: error: {message}")


def _error(capsys: pytest.CaptureFixture[str]) -> str:
    """The one ``prog: error: ...`` line a refused command printed last on stderr."""
    return capsys.readouterr().err.strip().splitlines()[-1]


@pytest.mark.parametrize(
    ("script", "argv", "message"),
    [
        (
            "benchmarks/bench_checkpoint.py",
            ["trainer.foo=1"],
            "override trainer.foo=1: Could not override 'trainer.foo'. To append to your config "
            "use +trainer.foo=1",
        ),
        (
            "benchmarks/bench_checkpoint.py",
            ["sharding.hbm_gb=-1"],
            "override sharding.hbm_gb=-1: sharding.hbm_gb=-1.0 must be a positive number of GiB "
            "per rank (tables plus optimizer state)",
        ),
        (  # of several overrides, the one the message is about
            "benchmarks/bench_checkpoint.py",
            ["trainer.seed=3", "sptt.comm_precision=fp8", "trainer.max_steps=2"],
            "override sptt.comm_precision=fp8: sptt.comm_precision='fp8'",
        ),
        (
            "benchmarks/bench_torchrec_dlrm.py",
            ["--override", "data.batch_size=0"],
            "override data.batch_size=0: data.batch_size=0",
        ),
        (
            "benchmarks/bench_criteo_loader.py",
            ["--experiment", "bogus"],
            "--experiment bogus: In 'config': Could not find 'experiment/bogus' Available options "
            "in 'experiment': criteo_forward_dcn",
        ),
    ],
)
def test_a_benchmark_names_a_bad_override_in_one_line(script, argv, message, capsys, monkeypatch):
    """A bad Hydra override was a traceback of 10-30 lines (under torchrun-like ranks for
    bench_torchrec_dlrm); now it is one line that names it, with Hydra's or dmt's message."""
    monkeypatch.setattr(sys, "argv", [script])
    with pytest.raises(SystemExit) as exit_:
        _load(REPO / script).main(["--smoke", "--runs", "1", *argv])
    assert exit_.value.code == 2
    assert _error(capsys).startswith(f"{Path(script).name}: error: {message}")


_SYNTHETIC_ONLY = (
    "this benchmark times the synthetic generator: give a synthetic data config "
    "(criteo_1tb_synthetic, synthetic, synthetic_random)"
)


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (
            "criteo_sample",
            f"--data criteo_sample is a criteo data set (data.kind=criteo); {_SYNTHETIC_ONLY}",
        ),
        ("bogus", f"--data bogus: no such data config; {_SYNTHETIC_ONLY}"),
    ],
)
def test_bench_synthetic_refuses_data_it_does_not_generate(data, message, capsys, monkeypatch):
    """--data criteo_sample timed the synthetic section every data config carries and reported
    it as criteo_sample; --data bogus was Hydra's traceback."""
    monkeypatch.setattr(sys, "argv", ["bench_synthetic.py"])
    bench = _load(REPO / "benchmarks" / "bench_synthetic.py")
    with pytest.raises(SystemExit) as exit_:
        bench.main(["--smoke", "--runs", "1", "--rows", "10", "--data", data])
    assert exit_.value.code == 2
    assert _error(capsys) == f"bench_synthetic.py: error: {message}"


def test_bench_pipeline_runs_dmt_train_in_the_callers_directory(tmp_path, monkeypatch):
    """dmt-train ran in the repository, so a relative path in an override
    (model.partition.path=mypart.yaml) was looked for there, not where the user ran the script.
    A stand-in interpreter reports the directory it was started in."""
    bench = _load(REPO / "benchmarks" / "bench_pipeline.py")
    python = tmp_path / "python"
    python.write_text('#!/bin/sh\necho "cwd=$(pwd -P)" >&2\nexit 3\n')
    python.chmod(0o755)
    monkeypatch.setattr(sys, "executable", str(python))
    monkeypatch.chdir(tmp_path)
    with pytest.raises(bench.RunFailed) as failed:
        bench.run(True, 1, ["model.partition.path=mypart.yaml"], tmp_path / "run")
    assert f"cwd={tmp_path.resolve()}\n" in str(failed.value) + "\n"


_ROW = "\t".join(["1", *["5"] * 13, *["68fd1e64"] * 26]) + "\n"  # a Criteo Kaggle row


def test_bench_preprocess_checks_the_samples_first_line_before_building(tmp_path, capsys):
    """A malformed --sample was found by dmt-preprocess only after the repeated file (1 GB by
    default) was built, as a traceback naming that file; the file stayed in --workdir."""
    bench = _load(REPO / "benchmarks" / "bench_preprocess.py")
    sample, workdir = tmp_path / "bad.tsv", tmp_path / "wd"
    sample.write_text("1\t2\n" + _ROW)
    argv = ["--sample", str(sample), "--smoke", "--runs", "1", "--workdir", str(workdir)]
    with pytest.raises(SystemExit) as exit_:
        bench.main([*argv, "--size-gb", "0.000001", "--skip-torchrec"])
    assert exit_.value.code == 2
    assert _error(capsys).endswith(
        f"error: --sample {sample}:1: found 2 tab-separated field(s); expected 40 tab-separated "
        "fields (label, 13 integer features I1..I13, 26 hexadecimal categorical features "
        "C1..C26) (Criteo Kaggle TSV)"
    )
    assert not workdir.exists()
    # a gzip sample passed that check (read decompressed), and its compressed bytes were repeated
    gz = tmp_path / "sample.tsv.gz"
    gz.write_bytes(gzip.compress(_ROW.encode()))
    with pytest.raises(SystemExit) as exit_:
        bench.main(["--sample", str(gz), *argv[2:], "--size-gb", "0.000001", "--skip-torchrec"])
    assert _error(capsys).endswith(
        f"error: --sample {gz} is gzip-compressed; this benchmark repeats the sample's bytes: "
        "give it uncompressed (gunzip -k)"
    )
    assert not workdir.exists()


@pytest.mark.parametrize("existing", [False, True])
def test_bench_preprocess_takes_away_what_a_failed_run_made(tmp_path, existing, monkeypatch):
    """A run that fails after building the repeated file removes it (and the --workdir it
    created), never a file it found there. The tools fail at once: the interpreter is false."""
    bench = _load(REPO / "benchmarks" / "bench_preprocess.py")
    sample, workdir = tmp_path / "sample.tsv", tmp_path / "new" / "wd"
    sample.write_text(_ROW * 3)
    if existing:
        workdir.mkdir(parents=True)
        (workdir / "notes.txt").write_text("mine\n")
    false = shutil.which("false")
    assert false is not None
    monkeypatch.setattr(sys, "executable", false)
    argv = ["--sample", str(sample), "--smoke", "--runs", "1", "--workdir", str(workdir)]
    with pytest.raises(subprocess.CalledProcessError):
        bench.main([*argv, "--size-gb", "0.000001", "--skip-torchrec", "--keep"])
    if existing:
        assert sorted(p.name for p in workdir.iterdir()) == ["notes.txt"]
    else:
        assert sorted(p.name for p in tmp_path.iterdir()) == ["sample.tsv"]


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--delay-us", "nan"], "--delay-us nan: must be a finite number >= 0 (microseconds)"),
        (["--delay-us", "-1"], "--delay-us -1.0: must be a finite number >= 0 (microseconds)"),
        pytest.param(
            [],
            "needs ns-3's Python bindings (the ns3 package): pip install 'dmt[sim]' (or ns3)",
            marks=pytest.mark.skipif(
                importlib.util.find_spec("ns") is not None, reason="ns-3 is installed"
            ),
        ),
    ],
)
def test_ns3_crosscheck_refuses_before_any_output(tmp_path, argv, message, capsys, monkeypatch):
    """Without ns-3 the table's header was printed and then came a traceback; a NaN delay passed
    the check and failed inside NetworkSpec, naming its field, not --delay-us."""
    monkeypatch.setattr(sys, "argv", ["ns3_crosscheck.py"])
    out = tmp_path / "x.json"
    with pytest.raises(SystemExit) as exit_:
        _load(REPO / "benchmarks" / "ns3_crosscheck.py").main(
            ["--quick", "--json", str(out), *argv]
        )
    assert exit_.value.code == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.strip().splitlines()[-1] == f"ns3_crosscheck.py: error: {message}"
    assert not out.exists()


_SMALL_STUDY = ["--flat-search", "uniform", "--presets", "h100", "--models", "dlrm"]


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (
            ["--sptt-sharding", "foo"],
            "--sptt-sharding foo: expected table_wise, column_wise or row_wise "
            "(sptt.sharding_type)",
        ),
        (
            ["--gpus", "16,24"],
            "--gpus 24 (3 hosts of 8): no paper tower count (no experiment paper_dmt_3t_dlrm); "
            "dlrm has 2, 4, 8, 16, 26 towers (one host per tower up to 16 hosts, then 16 towers "
            "of whole hosts)",
        ),
        (
            ["--gpus", "4"],
            "--gpus 4: needs whole hosts of 8 GPUs (a multiple of 8, at least one host)",
        ),
        (["--gpus", "abc"], "--gpus abc: expected comma-separated GPU counts, e.g. 16,32,64"),
        (
            ["--gpus", "136"],
            "--gpus 136: 17 hosts do not make 16 towers of equal whole hosts (the paper's tower "
            "counts: up to 16 hosts, one tower each; then 16 towers)",
        ),
        (
            ["--models", "foo"],
            "--models foo: no experiment paper_dmt_<T>t_foo in dmt/conf/experiment "
            "(models: dcn, dlrm)",
        ),
        (
            ["--presets", "h200"],
            "--presets h200: no dmt/conf/cluster/h200.yaml (have a100, cpu_emulated, h100, v100)",
        ),
        (["--gpus", "16,16"], "--gpus '16,16' names an entry twice"),
    ],
)
def test_scale_study_checks_every_entry_before_the_first_point(
    tmp_path, argv, message, capsys, monkeypatch
):
    """One bad entry made a study of errors that exited 0 (--sptt-sharding), or a traceback
    midway that left a partial results.json, so the rerun refused the directory; --out is not
    made."""
    monkeypatch.setattr(sys, "argv", ["scale_study.py"])
    out = tmp_path / "study"
    with pytest.raises(SystemExit) as exit_:
        _load(REPO / "benchmarks" / "scale_study.py").main(
            ["--out", str(out), "--gpus", "16", *_SMALL_STUDY, *argv]
        )
    assert exit_.value.code == 2
    assert _error(capsys) == f"scale_study.py: error: {message}"
    assert not out.exists()


def test_scale_study_refuses_an_out_that_is_a_file(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(sys, "argv", ["scale_study.py"])
    out = tmp_path / "bad.tsv"
    out.write_text("mine\n")
    with pytest.raises(SystemExit) as exit_:
        _load(REPO / "benchmarks" / "scale_study.py").main(["--out", str(out), *_SMALL_STUDY])
    assert exit_.value.code == 2
    assert _error(capsys) == f"scale_study.py: error: --out {out} is a file: give a new directory"
    assert out.read_text() == "mine\n"


def test_a_failed_scale_study_keeps_its_points_and_removes_the_rest(tmp_path, monkeypatch):
    """An interrupt or an error hours in: the points planned so far stay (results.json, written
    whole after each point); a table or figure of the end goes, and directories the study made
    go where nothing stays in them."""
    monkeypatch.setattr(sys, "argv", ["scale_study.py"])
    study = _load(REPO / "benchmarks" / "scale_study.py")

    def fails_after_one_point(args, scale):
        (args.out / "results.json").write_text('{"points": [1]}')
        (args.out / "table.md").write_text("|")
        raise KeyboardInterrupt

    monkeypatch.setattr(study, "_study", fails_after_one_point)
    out = tmp_path / "a" / "study"
    with pytest.raises(KeyboardInterrupt):
        study.main(["--out", str(out), "--gpus", "16", *_SMALL_STUDY])
    assert sorted(p.name for p in out.iterdir()) == ["results.json"]

    def fails_before_any_point(args, scale):
        raise RuntimeError("planner failed")

    monkeypatch.setattr(study, "_study", fails_before_any_point)
    out = tmp_path / "b" / "study"
    with pytest.raises(RuntimeError):
        study.main(["--out", str(out), "--gpus", "16", *_SMALL_STUDY])
    assert not (tmp_path / "b").exists()


# CI time (2 cores): bench_pipeline.py from another directory (5 s) runs with -m slow
@pytest.mark.slow
@pytest.mark.skipif(sys.version_info < (3, 11), reason="PYTHONSAFEPATH needs Python 3.11")
def test_bench_pipeline_imports_this_repositorys_dmt_in_any_directory(tmp_path, monkeypatch):
    """Reproduced bug: run from a directory holding a ``dmt/`` of its own, the script trained
    that one (``python -m`` puts the working directory first on ``sys.path``)."""
    bench = _load(REPO / "benchmarks" / "bench_pipeline.py")
    (tmp_path / "dmt").mkdir()
    (tmp_path / "dmt" / "__init__.py").write_text("")
    (tmp_path / "dmt" / "train.py").write_text("import sys\nsys.exit('another dmt')\n")
    monkeypatch.chdir(tmp_path)
    with pytest.raises(bench.RunFailed) as failed:  # this dmt-train refuses the key
        bench.run(True, 1, ["+trainer.no_such_key=1"], tmp_path / "run")
    assert "another dmt" not in str(failed.value)
    assert "no_such_key" in str(failed.value)


def test_bench_sptt_checks_the_node_rank_and_makes_the_init_file_absolute(
    tmp_path, capsys, monkeypatch
):
    """A relative --init-file was a traceback of torch's file:// rendezvous ("path missing");
    --node-rank -1 (or >= --nnodes) was never checked and failed in gloo."""
    bench = _load(REPO / "benchmarks" / "bench_sptt.py")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "argv", ["bench_sptt.py"])
    common = ["--nnodes", "2", "--world-size", "4"]
    args = bench._parse([*common, "--node-rank", "0", "--init-file", "rdv"])
    assert args.init_file == str(tmp_path / "rdv")
    for rank in ("-1", "2"):
        with pytest.raises(SystemExit) as exit_:
            bench._parse([*common, "--node-rank", rank, "--init-file", "rdv"])
        assert exit_.value.code == 2
        assert _error(capsys) == (
            f"bench_sptt.py: error: --node-rank {rank}: expected 0 to 1 (this launcher's index "
            "among --nnodes 2)"
        )
    with pytest.raises(SystemExit):
        bench._parse([*common, "--init-file", "no/such/dir/rdv"])
    assert _error(capsys) == (
        f"bench_sptt.py: error: --init-file {tmp_path / 'no/such/dir/rdv'}: expected a file in an "
        "existing directory (the launchers' rendezvous)"
    )


def test_scale_study_refuses_an_out_under_a_file_before_any_work(tmp_path, capsys, monkeypatch):
    """``--out afile/sub`` passed the checks and was a NotADirectoryError traceback."""
    monkeypatch.setattr(sys, "argv", ["scale_study.py"])
    afile = tmp_path / "afile"
    afile.write_text("mine\n")
    study = _load(REPO / "benchmarks" / "scale_study.py")
    monkeypatch.setattr(study, "_study", lambda args, scale: pytest.fail("the study started"))
    with pytest.raises(SystemExit) as exit_:
        study.main(["--out", str(afile / "sub"), "--gpus", "16", *_SMALL_STUDY])
    assert exit_.value.code == 2
    assert (
        _error(capsys)
        == f"scale_study.py: error: --out {afile / 'sub'}: {afile} is not a directory"
    )
    assert afile.read_text() == "mine\n"


def test_bench_preprocess_never_removes_or_replaces_what_it_did_not_make(tmp_path, monkeypatch):
    """Reproduced bugs: a run removed <workdir>/out-dmt/ (a user's notes in it too) and wrote
    over <workdir>/dmt-run1.log, and a second run (another --json) replaced the first run's
    logs. The tools are stand-ins (the interpreter is ``true``): only the files are tested."""
    bench = _load(REPO / "benchmarks" / "bench_preprocess.py")
    sample, workdir = tmp_path / "sample.tsv", tmp_path / "wd"
    sample.write_text(_ROW * 3)
    (workdir / "out-dmt").mkdir(parents=True)
    (workdir / "out-dmt" / "notes.txt").write_text("mine\n")
    (workdir / "dmt-run1.log").write_text("my log\n")
    true = shutil.which("true")
    assert true is not None
    monkeypatch.setattr(sys, "executable", true)
    argv = ["--sample", str(sample), "--smoke", "--runs", "1", "--workdir", str(workdir)]
    argv += ["--size-gb", "0.000001", "--skip-torchrec"]
    assert bench.main([*argv, "--json", str(tmp_path / "first.json")]) == 0
    assert (workdir / "out-dmt" / "notes.txt").read_text() == "mine\n"
    assert (workdir / "dmt-run1.log").read_text() == "my log\n"
    first = Path(json.loads((tmp_path / "first.json").read_text())["logs"])
    assert first.parent == workdir and sorted(p.name for p in first.iterdir()) == ["dmt-run1.log"]
    (first / "dmt-run1.log").write_text("the first run's log\n")
    assert bench.main([*argv, "--json", str(tmp_path / "second.json")]) == 0
    second = Path(json.loads((tmp_path / "second.json").read_text())["logs"])
    assert second != first and (second / "dmt-run1.log").is_file()
    assert (first / "dmt-run1.log").read_text() == "the first run's log\n"
    assert not (workdir / "kaggle_repeated.tsv").exists()  # built and taken away (no --keep)
    # a repeated file of another size is not this run's to replace: refused before building
    (workdir / "kaggle_repeated.tsv").write_text("mine\n")
    with pytest.raises(SystemExit) as exit_:
        bench.main([*argv, "--json", str(tmp_path / "third.json")])
    assert exit_.value.code == 2
    assert (workdir / "kaggle_repeated.tsv").read_text() == "mine\n"
    assert not (tmp_path / "third.json").exists()
    # one of this size (an earlier --keep run's) is reused, and left as it was found
    (workdir / "kaggle_repeated.tsv").unlink()
    assert bench.main([*argv, "--keep", "--json", str(tmp_path / "keep.json")]) == 0
    kept = (workdir / "kaggle_repeated.tsv").stat().st_mtime_ns
    assert bench.main([*argv, "--json", str(tmp_path / "reuse.json")]) == 0
    assert (workdir / "kaggle_repeated.tsv").stat().st_mtime_ns == kept


@pytest.mark.parametrize("keep", [False, True])
def test_bench_preprocess_keeps_the_last_outputs_with_keep(tmp_path, keep, monkeypatch):
    """Reproduced bug: --keep said "keep the raw file and outputs", but every run's outputs were
    removed after it. The tool is a stand-in that makes its output directory with one file
    (``-m dmt.data.preprocess_cli RAW OUT ...``: OUT is its fourth argument)."""
    bench = _load(REPO / "benchmarks" / "bench_preprocess.py")
    sample, workdir = tmp_path / "sample.tsv", tmp_path / "wd"
    sample.write_text(_ROW * 3)
    python = tmp_path / "python"
    python.write_text(
        '#!/bin/sh\nif [ -n "$4" ]; then mkdir "$4" && echo "$4" > "$4/manifest.json"; fi\n'
    )
    python.chmod(0o755)
    monkeypatch.setattr(sys, "executable", str(python))
    argv = ["--sample", str(sample), "--smoke", "--runs", "2", "--workdir", str(workdir)]
    argv += ["--size-gb", "0.000001", "--skip-torchrec", "--json", str(tmp_path / "r.json")]
    assert bench.main([*argv, *(["--keep"] if keep else [])]) == 0
    run_dir = Path(json.loads((tmp_path / "r.json").read_text())["logs"])
    names = ["dmt-run1.log", "dmt-run2.log", *(["out-dmt"] if keep else [])]
    assert sorted(p.name for p in run_dir.iterdir()) == names
    if keep:
        assert (run_dir / "out-dmt" / "manifest.json").read_text() == f"{run_dir / 'out-dmt'}\n"
    assert (workdir / "kaggle_repeated.tsv").exists() == keep


def test_bench_torchrec_dlrms_reference_trains_as_dmt_default_does(one_thread):
    """The reference (torchrec_dlrm's loop) and dmt's default build the same DLRM from the same
    seed and train it on the same batches with Adagrad lr 0.01 (eps: FBGEMM's 1e-8 on the
    tables, torch's default 1e-10 on the dense part, as dlrm_main.py): the same mean loss. dmt's
    dense Adagrad had optim=adagrad's eps 1e-8, and its mean loss over these 10 steps was 0.8907
    against the reference's 0.8976."""
    from dmt.data import build_data  # noqa: PLC0415
    from dmt.runtime import close_runtime, init_runtime  # noqa: PLC0415

    bench = _load(REPO / "benchmarks" / "bench_torchrec_dlrm.py")
    extra = (
        "data=synthetic_random",
        "data.synthetic.num_train=5120",
        "data.synthetic.cardinality=1000",
        "data.batch_size=512",
    )
    rt = init_runtime("cpu")
    try:
        cfg = bench.dmt_config("dmt default", "cpu", extra)
        data = build_data(cfg.data, rank=0, world_size=1, seed=cfg.trainer.seed)
        batches = bench.training_batches(data, 10)
        result = bench.run(
            rt,
            data,
            batches,
            warmup=0,
            block=10,
            first=0,
            extra=extra,
            variants=("reference", "dmt default"),
        )
    finally:
        close_runtime()
    assert result["reference"][1] == pytest.approx(result["dmt default"][1], rel=1e-6, abs=0)


def _spaced(text: str) -> str:
    """``text`` with every run of whitespace one space (the README wraps its lines)."""
    return " ".join(text.split())


def _records(name: str) -> Any:
    return json.loads((REPO / "benchmarks" / "results" / name).read_text())


def test_the_readmes_2026_12_05_figures_are_those_of_its_records():
    """Reproduced: the README's 2026-12-05 paragraphs gave samples/s ranges from two of the
    three recorded bench_torchrec_dlrm invocations (the third's runs reached 15,644 and 13,061
    samples/s, below them), flat's fp32 range from 184 (a run median of 183.49 ms) and DMT's as
    86-86 (85.46 ms), and DMT's throttled / unthrottled step as 1.18x / 1.12x (1.17x / 1.13x)."""
    readme = _spaced((REPO / "README.md").read_text())
    rates: dict[str, list[float]] = {"dmt default": [], "reference": []}
    for i in (1, 2, 3):
        record = _records(f"bench_2026-12-05/bench_torchrec_dlrm_{i}.json")
        for variant, values in rates.items():
            values.extend(record["samples_per_s"][variant])
    dmt, ref = rates["dmt default"], rates["reference"]
    assert (
        f"Samples/s, every run of the three recorded invocations: dmt {min(dmt):,.0f}-"
        f"{max(dmt):,.0f}, the reference {min(ref):,.0f}-{max(ref):,.0f}."
    ) in readme

    def median_ms(records: list[Any], mode: str, precision: str) -> list[float]:
        return [
            r["ms_per_step"]
            for r in records
            if r["mode"] == mode and r["comm_precision"] == precision and r["pipeline"]
        ]

    passes = [_records(f"bench_2026-12-05/bench_sptt_2x2_b2048_pass{i}.json") for i in (1, 2, 3)]
    unthrottled = _records("bench_2026-12-05/bench_sptt_2x2_b2048_unthrottled.json")
    slower: dict[str, list[float]] = {"flat": [], "dmt": []}
    for precision in ("fp32", "bf16"):
        cells = []
        for mode in ("flat", "dmt"):
            ms = [t for p in passes for t in median_ms(p, mode, precision)]
            assert len(ms) == 3
            cells.append(f"{statistics.median(ms):.0f} ({min(ms):.0f}-{max(ms):.0f})")
            (base,) = median_ms(unthrottled, mode, precision)
            slower[mode].append(statistics.median(ms) / base)
        speedups = [
            median_ms(p, "flat", precision)[0] / median_ms(p, "dmt", precision)[0] for p in passes
        ]
        per_pass = " / ".join(f"{x:.2f}" for x in speedups)
        assert (
            f"| 2026-12-05 | {precision} | {cells[0]} | {cells[1]} | "
            f"**{statistics.median(speedups):.2f}x** ({per_pass}) |"
        ) in readme
    flat, dmt_ = slower["flat"], slower["dmt"]
    assert (
        f"Throttled, flat's step is {flat[0]:.1f}x / {flat[1]:.1f}x its unthrottled time; DMT's "
        f"is {dmt_[0]:.2f}x / {dmt_[1]:.2f}x."
    ) in readme


def test_bench_torchrec_dlrms_reference_plans_without_torchrecs_topology_warning(caplog):
    """A reproduced bug: every run of bench_torchrec_dlrm printed TorchRec's warning "The
    topology was constructed directly rather than via TopologyFactory.create_topology() ...
    otherwise, the job will fail": the reference built its planner's ``Topology`` itself. It is
    built by ``TopologyFactory`` now (the same topology), and the reference still plans."""
    from dmt.data import build_data  # noqa: PLC0415
    from dmt.runtime import close_runtime, init_runtime  # noqa: PLC0415

    bench = _load(REPO / "benchmarks" / "bench_torchrec_dlrm.py")
    cfg = typed_config(
        "data.synthetic.num_train=1024", "data.synthetic.num_val=256",
        "data.synthetic.num_test=256", "data.batch_size=256",
    )  # fmt: skip
    init_runtime("cpu")
    try:
        data = build_data(cfg.data)
        with caplog.at_level(logging.WARNING):
            pipeline, _ = bench.reference_pipeline(data, cfg, torch.device("cpu"))
    finally:
        close_runtime()
    assert not [r for r in caplog.records if "constructed directly" in r.getMessage()], caplog.text
    assert len(pipeline._model.plan.plan) == 1  # the reference's sharded tables
