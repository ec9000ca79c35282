"""dmt-plan-calibrate's pieces: per-rank collectives from a run's counts, the fit, the preset."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from dmt.planning import calibrate
from dmt.planning.calibrate import (
    Run,
    _base,
    _flat_collectives,
    _matches,
    _sptt_collectives,
    fit,
    load_run,
    main,
    predict,
    write_preset,
)
from dmt.planning.collectives import CollectiveBytes as Collective
from dmt.planning.hardware import ClusterConfig, register_cluster_configs, validate_cluster
from dmt.planning.timing import MODES, ComputeLoad, ModeWorkload


def _counts(**steps: tuple[float, float]) -> dict[str, float]:
    out = {}
    for key, (sent, cross) in steps.items():
        path = key.replace("__", "/")
        out[f"{path}/bytes_sent"], out[f"{path}/bytes_cross_host"] = sent, cross
    return out


SPTT = {
    "mode": "sptt",
    "hosts_per_tower": 1,
    "bytes_per_step": _counts(
        a__world__forward=(400, 200),
        d__tower__forward=(800, 0),
        f__peer__backward=(80, 80),
        tm__tower__backward=(0, 0),
        dense__world__backward=(200, 100),
    ),
}


def test_sptt_collectives_per_rank() -> None:
    # G = 4 ranks, L = 2 per host: towers of 2 ranks, peer groups of 2; counts summed over ranks
    assert _sptt_collectives(SPTT, 4, 2) == [
        Collective("a", "all_to_all", "world", "forward", 4, 50, 50, True),
        Collective("d", "all_to_all", "tower", "forward", 2, 200, 0, False),
        Collective("dense_allreduce", "all_reduce", "world", "backward", 4, 25, 25, True),
        Collective("f", "all_to_all", "peer", "backward", 2, 0, 20, True),
    ]


def test_flat_collectives_from_traced_world_bytes() -> None:
    # traced: 2400 B (1300 cross) over the world, less step a's ids and the dense all-reduce
    # (as SPTT counted them): 1800 (1000 cross) of pooled all-to-all, half each way
    flat = {"traced_bytes_per_step": {"world/bytes_sent": 2400, "world/bytes_cross_host": 1300}}
    assert _flat_collectives(flat, SPTT, 4) == [
        Collective("flat_input_a2a", "all_to_all", "world", "forward", 4, 50, 50, True),
        Collective("dense_allreduce", "all_reduce", "world", "backward", 4, 25, 25, True),
        Collective("flat_output_a2a", "all_to_all", "world", "forward", 4, 100, 125, False),
        Collective("flat_output_a2a", "all_to_all", "world", "backward", 4, 100, 125, False),
    ]


def _runs(truth: ClusterConfig, nic_efficiency: float) -> list[Run]:
    loads = {
        "flat": ComputeLoad(2.0, 0.1, 1e4),
        "sptt": ComputeLoad(2.0, 0.1, 1e4),
        "dmt": ComputeLoad(1.5, 0.05, 1e4),
    }
    runs = []
    for rate in (1e9, 2.5e9, None):
        for batch in (512, 2048):
            s = batch / 512
            colls = {
                "flat": [
                    Collective(
                        "flat_input_a2a", "all_to_all", "world", "forward", 4, 8000, 8000, True
                    ),
                    Collective(
                        "flat_output_a2a",
                        "all_to_all",
                        "world",
                        "forward",
                        4,
                        int(4e5 * s),
                        int(4e5 * s),
                        False,
                    ),
                    Collective(
                        "flat_output_a2a",
                        "all_to_all",
                        "world",
                        "backward",
                        4,
                        int(4e5 * s),
                        int(4e5 * s),
                        False,
                    ),
                    Collective(
                        "dense_allreduce", "all_reduce", "world", "backward", 4, 40000, 40000, True
                    ),
                ],
                "sptt": [
                    Collective("a", "all_to_all", "world", "forward", 4, 8000, 8000, True),
                    Collective("d", "all_to_all", "tower", "forward", 2, int(8e5 * s), 0, False),
                    Collective("f", "all_to_all", "peer", "forward", 2, 0, int(4e5 * s), True),
                    Collective(
                        "dense_allreduce", "all_reduce", "world", "backward", 4, 40000, 40000, True
                    ),
                ],
            }
            colls["dmt"] = [
                replace(c, cross_host_bytes=c.cross_host_bytes // 4) if c.step == "f" else c
                for c in colls["sptt"]
            ]
            work = {m: ModeWorkload(colls[m], loads[m]) for m in MODES}
            name = f"G4_{'none' if rate is None else f'{rate:g}'}_B{batch}"
            run = Run(name, 4, 2, name.split("_")[1], rate, batch, work, {m: 1.0 for m in MODES})
            times = predict(truth, nic_efficiency, run)
            runs.append(replace(run, measured_ms={m: times[m].total_ms for m in MODES}))
    return runs


def test_fit_reproduces_runs_made_by_the_model() -> None:
    base = _base(cores=2, peak_tflops=0.1, hbm_gbps=10.0)
    truth = replace(
        base,
        compute_efficiency=0.2,
        intra_bandwidth_gbps=0.5,
        intra_latency_us=300.0,
        nic_latency_us=800.0,
        collective_overhead_us=200.0,
        step_overhead_ms=5.0,
    )
    runs = _runs(truth, nic_efficiency=0.8)
    fitted, eff, rms = fit(base, runs[:4])
    assert rms < 1e-3
    for run in runs:  # the two loopback runs were not fitted
        times = predict(fitted, eff, run)
        for m in MODES:
            assert times[m].total_ms == pytest.approx(run.measured_ms[m], rel=0.02)


def test_holdout_selection() -> None:
    run = Run("G8_1gbit_B512", 8, 2, "1gbit", 1e9, 512, {}, {})
    assert _matches(run, "G=8") and _matches(run, "rate=none,batch=512")
    assert not _matches(run, "G=4,rate=2500mbit")
    with pytest.raises(ValueError) as err:
        _matches(run, "hosts=4")
    assert str(err.value) == (
        "--holdout term 'hosts=4': expected KEY=VALUE with KEY one of ['G', 'batch', 'name', 'rate']"
    )


def test_written_preset_composes(tmp_path: Path) -> None:
    cluster = replace(_base(2, 0.1, 10.0), compute_efficiency=0.25, source="test")
    (tmp_path / "cluster").mkdir()
    write_preset(tmp_path / "cluster" / "fitted.yaml", cluster, 0.8, 1e9, ["a note"])
    register_cluster_configs()
    with initialize_config_dir(config_dir=str(tmp_path), version_base=None):
        cfg = compose(config_name=None, overrides=["+cluster=fitted"])
    loaded = OmegaConf.to_object(cfg.cluster)
    assert isinstance(loaded, ClusterConfig)
    validate_cluster(loaded)
    assert loaded == replace(cluster, nic_bandwidth_gbps=0.1)  # 1 Gbit/s x 0.8


def _run_file(path: Path, rate: str, batch: int, ms: dict[str, float]) -> None:
    """A calibration_runs.sh JSON of G = 4 (L = 2) with bench_sptt's byte counts at B = 512
    (measured on this model), scaled to ``batch``."""
    s = batch / 512
    sptt_counts = _counts(
        a__world__forward=(638976 * s, 425984 * s),
        d__tower__forward=(3407872 * s, 0),
        d__tower__backward=(3407872 * s, 0),
        f__peer__forward=(3407872 * s, 3407872 * s),
        f__peer__backward=(3407872 * s, 3407872 * s),
        dense__world__backward=(662808, 331404),
    )
    dmt_counts = {
        **sptt_counts,
        **_counts(
            f__peer__forward=(851968 * s, 851968 * s),
            f__peer__backward=(851968 * s, 851968 * s),
            tm__tower__backward=(4224, 0),
        ),
    }
    flat_traced = {"world/bytes_sent": 11525688 * s, "world/bytes_cross_host": 7573324 * s}
    records: list[dict[str, Any]] = [
        {"mode": "flat", "peer_permute": None, "traced_bytes_per_step": flat_traced},
        {"mode": "sptt", "peer_permute": None, "hosts_per_tower": 1, "bytes_per_step": sptt_counts},
        {"mode": "dmt", "peer_permute": None, "hosts_per_tower": 1, "bytes_per_step": dmt_counts},
    ]
    for r in records:  # each run's median ms per step: the fastest first
        r["ms_per_step_runs"] = [ms[r["mode"]], 1.2 * ms[r["mode"]], 1.1 * ms[r["mode"]]]
    data = {
        "settings": {
            "world_size": 4,
            "local_world_size": 2,
            "rate": rate,
            "rate_bit_per_s": None if rate == "none" else float(rate.removesuffix("gbit")) * 1e9,
            "throttled": rate != "none",
            "batch_per_rank": batch,
        },
        "records": records,
        "command": f"sudo bash scripts/netns_throttle.sh -- python benchmarks/bench_sptt.py "
        f"--world-size 4 --local-world-size 2 --batch {batch} --json /tmp/x.json",
    }
    path.write_text(json.dumps(data))


def test_command_end_to_end(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    runs = tmp_path / "runs"
    runs.mkdir()
    measured = {  # step times measured at G = 4 (ms): flat, sptt, dmt
        ("1gbit", 512): (79.4, 78.3, 57.6),
        ("1gbit", 2048): (228.2, 237.8, 121.9),
        ("none", 512): (57.7, 60.6, 56.1),
        ("none", 2048): (161.4, 151.6, 144.1),
    }
    for (rate, batch), times in measured.items():
        _run_file(
            runs / f"G4_{rate}_B{batch}.json", rate, batch, dict(zip(MODES, times, strict=True))
        )
    (runs / "repeats").mkdir()  # the same cell again, faster: the min over both files counts
    faster = {m: 0.9 * t for m, t in zip(MODES, measured["none", 512], strict=True)}
    _run_file(runs / "repeats" / "G4_none_B512.json", "none", 512, faster)
    (tmp_path / "cluster").mkdir()
    preset, report = tmp_path / "cluster" / "fitted.yaml", tmp_path / "report.json"
    main([str(runs), "--holdout", "rate=none", "--out", str(preset), "--json", str(report)])
    out = json.loads(report.read_text())
    assert [(r["run"], r["held_out"]) for r in out["runs"]] == [
        ("G4_1gbit_B2048", False),
        ("G4_1gbit_B512", False),
        ("G4_none_B2048", True),
        ("G4_none_B512", True),
    ]
    assert out["runs"][0]["measured_ms"] == dict(zip(MODES, measured["1gbit", 2048], strict=True))
    assert out["runs"][3]["measured_ms"] == faster
    assert "held-out step times: median abs error" in capsys.readouterr().out
    before = preset.read_text()
    # a second run never replaces the first's
    assert _refused(capsys, [str(runs), "--out", str(preset)]).startswith(
        f"--out {preset} exists: pass --overwrite"
    )
    assert preset.read_text() == before
    register_cluster_configs()
    with initialize_config_dir(config_dir=str(tmp_path), version_base=None):
        cfg = compose(config_name=None, overrides=["+cluster=fitted"])
    fitted = OmegaConf.to_object(cfg.cluster)
    assert isinstance(fitted, ClusterConfig)
    validate_cluster(fitted)
    assert (fitted.name, fitted.gpus_per_host, fitted.ranks_per_nic) == ("cpu_emulated", 2, 2)


def _refused(capsys: pytest.CaptureFixture[str], argv: list[str]) -> str:
    """The error of ``dmt-plan-calibrate argv``, which must be refused as argparse refuses
    (exit status 2, ``... error: <message>`` on stderr)."""
    capsys.readouterr()
    with pytest.raises(SystemExit) as refused:
        main(argv)
    assert refused.value.code == 2
    err = capsys.readouterr().err
    return err.split("error: ", 1)[1].strip()


def test_settings_are_checked_before_the_fit_writes_anything(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Reproduced bugs: a mistyped ``--rate`` failed after the fit had written ``--json`` (the
    corrected command was then refused for it); a ``--holdout`` matching no run wrote a preset
    "validated with --holdout G=16" that held nothing out; a bad key ended in a traceback."""
    runs = tmp_path / "runs"
    runs.mkdir()
    for rate, batch in (("1gbit", 512), ("none", 512)):
        _run_file(runs / f"G4_{rate}_B{batch}.json", rate, batch, dict.fromkeys(MODES, 60.0))
    report, preset = tmp_path / "report.json", tmp_path / "fitted.yaml"
    cases = {
        ("--rate", "1Gbit"): "--rate '1Gbit': expected a positive rate, e.g. 1gbit, 2500mbit",
        ("--rate", "1.2.3gbit"): "--rate '1.2.3gbit': expected a positive rate",
        ("--holdout", "G=16"): "--holdout 'G=16' leaves 0 of the 2 runs out: it must leave some "
        "out and fit on the others (runs: G4_1gbit_B512, G4_none_B512)",
        ("--holdout", "G=4"): "--holdout 'G=4' leaves 2 of the 2 runs out",
        ("--holdout", "g=4"): "--holdout term 'g=4': expected KEY=VALUE with KEY one of "
        "['G', 'batch', 'name', 'rate']",
    }
    for (flag, value), message in cases.items():
        error = _refused(
            capsys, [str(runs), flag, value, "--json", str(report), "--out", str(preset)]
        )
        assert error.startswith(message), error
        assert not report.exists() and not preset.exists()


def test_impossible_hardware_and_outputs_are_refused_before_the_fit(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Reproduced bugs: ``--peak-tflops -1`` and ``--cores 0`` fitted and printed a preset,
    ``--memory-gbps 0`` ended in a ZeroDivisionError; a ``--json`` or ``--out`` in a missing
    directory failed after the fit (the other one written), and ``--json x --out x`` wrote the
    preset over the JSON; a missing runs directory read "no *.json in"; ``--json`` naming a
    measured run replaced it (with ``--overwrite``)."""
    runs = tmp_path / "runs"
    runs.mkdir()
    for rate, batch in (("1gbit", 512), ("none", 512)):
        _run_file(runs / f"G4_{rate}_B{batch}.json", rate, batch, dict.fromkeys(MODES, 60.0))
    report, preset = tmp_path / "report.json", tmp_path / "fitted.yaml"
    (tmp_path / "afile").write_text("not a directory\n")
    cases = {
        ("--peak-tflops", "-1"): "--peak-tflops -1: must be > 0 (TFLOP/s of one core)",
        ("--peak-tflops", "nan"): "--peak-tflops nan: must be > 0 (TFLOP/s of one core)",
        ("--memory-gbps", "0"): "--memory-gbps 0: must be > 0 (GB/s per rank)",
        ("--cores", "0"): "--cores 0: must be at least 1",
        (
            "--json",
            str(preset),
        ): f"--json and --out are the same file ({preset}): give each its own",
        ("--json", str(tmp_path / "afile" / "r.json")): (
            f"--json {tmp_path / 'afile' / 'r.json'}: {tmp_path / 'afile'} is not a directory"
        ),
    }
    for (flag, value), message in cases.items():
        argv = [str(runs), "--json", str(report), "--out", str(preset), flag, value]
        assert _refused(capsys, argv) == message
        assert not report.exists() and not preset.exists()
    assert _refused(capsys, [str(tmp_path / "nowhere")]) == (
        f"runs directory {tmp_path / 'nowhere'} does not exist"
    )
    # reproduced: --json (or --out) naming a measured run replaced it with the report
    (runs / "repeats").mkdir()
    _run_file(runs / "repeats" / "G4_none_B512.json", "none", 512, dict.fromkeys(MODES, 50.0))
    for flag, run in (("--json", "G4_1gbit_B512.json"), ("--out", "repeats/G4_none_B512.json")):
        before = (runs / run).read_text()
        argv = [str(runs), "--holdout", "rate=none", flag, str(runs / run), "--overwrite"]
        assert _refused(capsys, argv) == (
            f"{flag} {runs / run} is one of the measured runs it reads; write elsewhere"
        )
        assert (runs / run).read_text() == before
    # a missing parent directory is made, and both files are written whole
    report, preset = tmp_path / "new" / "report.json", tmp_path / "new2" / "fitted.yaml"
    main([str(runs), "--holdout", "rate=none", "--json", str(report), "--out", str(preset)])
    assert json.loads(report.read_text())["holdout"] == "rate=none"
    assert preset.read_text().startswith("# CPU cluster emulated")
    assert sorted(p.name for p in report.parent.iterdir()) == ["report.json"]  # no temporary


def test_a_failed_preset_leaves_both_outputs_as_they_were(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Reproduced bug: with ``--overwrite``, a preset that could not be written left the new
    ``--json`` beside the old preset (a report of another fit than the preset's); a new
    ``--json`` directory stayed behind, empty."""
    runs = tmp_path / "runs"
    runs.mkdir()
    for rate, batch in (("1gbit", 512), ("none", 512)):
        _run_file(runs / f"G4_{rate}_B{batch}.json", rate, batch, dict.fromkeys(MODES, 60.0))
    report, preset = tmp_path / "report.json", tmp_path / "fitted.yaml"
    report.write_text("an earlier report\n")
    preset.write_text("an earlier preset\n")

    def fail(*args: object) -> None:
        raise OSError("disk full")

    monkeypatch.setattr(calibrate, "write_preset", fail)
    argv = [str(runs), "--holdout", "rate=none", "--out", str(preset), "--overwrite"]
    with pytest.raises(OSError, match="disk full"):
        main([*argv, "--json", str(report)])
    assert report.read_text() == "an earlier report\n"
    assert preset.read_text() == "an earlier preset\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["fitted.yaml", "report.json", "runs"]
    with pytest.raises(OSError, match="disk full"):
        main([*argv, "--json", str(tmp_path / "new" / "report.json")])
    assert sorted(p.name for p in tmp_path.iterdir()) == ["fitted.yaml", "report.json", "runs"]
    monkeypatch.undo()
    main([*argv, "--json", str(report)])
    assert json.loads(report.read_text())["holdout"] == "rate=none"
    assert preset.read_text().startswith("# CPU cluster emulated")


def test_files_that_are_not_records_and_a_single_run_are_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Reproduced bugs: a JSON file without the record's keys among the runs was a KeyError
    traceback, one recording another command than bench_sptt.py's a StopIteration, one whose
    command has an argument bench_sptt.py does not take printed bench_sptt's usage as this
    command's; --holdout each with one run fitted, then failed with a traceback."""
    runs = tmp_path / "runs"
    runs.mkdir()
    _run_file(runs / "G4_1gbit_B512.json", "1gbit", 512, dict.fromkeys(MODES, 60.0))
    assert _refused(capsys, [str(runs), "--holdout", "each"]) == (
        f"--holdout each predicts every run from a fit on the others: it needs at least 2 runs, "
        f"{runs} has 1"
    )
    (runs / "bad.json").write_text('{"foo": 1}')
    assert _refused(capsys, [str(runs), "--holdout", "name=bad"]) == (
        f"{runs / 'bad.json'}: not a bench_sptt.py record (no 'settings')"
    )
    (runs / "bad.json").write_text("{")
    assert _refused(capsys, [str(runs), "--holdout", "name=bad"]).startswith(
        f"{runs / 'bad.json'}: not a bench_sptt.py record (JSONDecodeError: "
    )
    # reproduced: a record of another command was a StopIteration traceback
    _run_file(runs / "bad.json", "none", 512, dict.fromkeys(MODES, 60.0))
    record = json.loads((runs / "bad.json").read_text())
    record["command"] = "python bench.py --world-size 4"
    (runs / "bad.json").write_text(json.dumps(record))
    assert _refused(capsys, [str(runs), "--holdout", "name=bad"]) == (
        f"{runs / 'bad.json'}: not a bench_sptt.py record (its command runs no bench_sptt.py: "
        "'python bench.py --world-size 4')"
    )
    # reproduced: "calibrate.py: error: unrecognized arguments: --bogus 2", naming no file
    record["command"] = "python benchmarks/bench_sptt.py --bogus 2"
    (runs / "bad.json").write_text(json.dumps(record))
    assert _refused(capsys, [str(runs), "--holdout", "name=bad"]) == (
        f"{runs / 'bad.json'}: not a bench_sptt.py record (its command's arguments are not "
        "bench_sptt.py's (unrecognized arguments: --bogus 2): "
        "'python benchmarks/bench_sptt.py --bogus 2')"
    )
    (runs / "bad.json").unlink()
    (runs / "repeats").mkdir()
    (runs / "repeats" / "G4_1gbit_B512.json").write_text("[]")
    assert _refused(capsys, [str(runs), "--holdout", "each"]) == (
        f"{runs / 'repeats' / 'G4_1gbit_B512.json'}: not a bench_sptt.py record (TypeError: "
        "list indices must be integers or slices, not str)"
    )


def test_the_docs_calibration_commands_run_in_a_checkout(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Reproduced bug: docs/time_model.md's command that rewrites the shipped preset lacked
    ``--overwrite``, so it stopped at once with ``--out dmt/conf/cluster/cpu_emulated.yaml exists``.
    Every ``python -m dmt.planning.calibrate`` line of its Calibration block must pass the argument
    checks in a checkout (its ``--out`` a copy of the file it names, as it exists there)."""
    root = Path(__file__).resolve().parents[2]
    block = (root / "docs" / "time_model.md").read_text().split("## Calibration", 1)[1]
    block = block.split("```bash\n", 1)[1].split("```", 1)[0].replace("\\\n", " ")
    commands = [
        line.split("#", 1)[0].split()[3:]
        for line in block.splitlines()
        if line.startswith("python -m dmt.planning.calibrate ")
    ]
    assert len(commands) == 2 and any("--out" in argv for argv in commands)

    class _Checked(Exception):
        """The arguments passed every check: the runs are about to be read."""

    def reached(*args: Any, **kwargs: Any) -> None:
        raise _Checked

    monkeypatch.setattr(calibrate, "load_run", reached)
    for argv in commands:
        argv = [str(root / argv[0]), *argv[1:]]
        if "--out" in argv:
            named = root / argv[argv.index("--out") + 1]
            copy = tmp_path / named.name
            copy.write_text(named.read_text())
            argv[argv.index("--out") + 1] = str(copy)
        with pytest.raises(_Checked):
            main(argv)


def test_records_of_impossible_numbers_are_refused_naming_the_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Reproduced bugs: a record whose mode has no step times read "min() arg is an empty
    sequence", a step time that is no number "could not convert string to float: 'abc'", a
    world size that is no number "invalid literal for int()", all naming no file; a step time of
    0 or below ended in a ZeroDivisionError or "math domain error" traceback after the fit
    started, as did a batch of 0 and a world size that is no multiple of the ranks per host; a
    throttled run without its rate was fitted as loopback."""
    runs = tmp_path / "runs"
    runs.mkdir()
    _run_file(runs / "G4_none_B512.json", "none", 512, dict.fromkeys(MODES, 60.0))
    bad = runs / "G4_1gbit_B512.json"
    cases: dict[str, tuple[tuple[str, ...], object, str]] = {
        "no step times": (
            ("records", "0", "ms_per_step_runs"),
            [],
            "mode 'flat': ms_per_step_runs=[], expected a non-empty list of positive step "
            "times (ms)",
        ),
        "a text": (
            ("records", "1", "ms_per_step_runs"),
            ["abc"],
            "mode 'sptt': ms_per_step_runs=['abc'], expected a non-empty list of positive step "
            "times (ms)",
        ),
        "zero": (
            ("records", "2", "ms_per_step_runs"),
            [60.0, 0.0],
            "mode 'dmt': ms_per_step_runs=[60.0, 0.0], expected a non-empty list of positive "
            "step times (ms)",
        ),
        "world size": (
            ("settings", "world_size"),
            "four",
            "settings.world_size='four', expected an integer >= 1",
        ),
        "batch": (
            ("settings", "batch_per_rank"),
            0,
            "settings.batch_per_rank=0, expected an integer >= 1",
        ),
        "hosts": (
            ("settings", "local_world_size"),
            3,
            "settings.world_size=4 is not a multiple of settings.local_world_size=3 x "
            "hosts_per_tower=1 (towers of whole hosts)",
        ),
        "rate": (
            ("settings", "rate_bit_per_s"),
            None,
            "settings.rate_bit_per_s=None of a throttled run, expected a positive rate in bit/s",
        ),
    }
    for key, value, why in cases.values():
        _run_file(bad, "1gbit", 512, dict.fromkeys(MODES, 60.0))
        record = json.loads(bad.read_text())
        node = record
        for k in key[:-1]:
            node = node[int(k)] if isinstance(node, list) else node[k]
        node[key[-1]] = value
        bad.write_text(json.dumps(record))
        argv = [str(runs), "--holdout", "rate=none", "--json", str(tmp_path / "r.json")]
        assert _refused(capsys, argv) == f"{bad}: not a bench_sptt.py record ({why})"
        assert not (tmp_path / "r.json").exists()
    # a repeat of the cell is checked as its file
    _run_file(bad, "1gbit", 512, dict.fromkeys(MODES, 60.0))
    (runs / "repeats").mkdir()
    repeat = runs / "repeats" / bad.name
    _run_file(repeat, "1gbit", 512, dict.fromkeys(MODES, 60.0))
    record = json.loads(repeat.read_text())
    record["records"][0]["ms_per_step_runs"] = [-1.0]
    repeat.write_text(json.dumps(record))
    assert _refused(capsys, [str(runs), "--holdout", "rate=none"]) == (
        f"{repeat}: not a bench_sptt.py record (mode 'flat': ms_per_step_runs=[-1.0], expected "
        "a non-empty list of positive step times (ms))"
    )


def test_the_fit_reads_the_pipelined_fp32_record_of_each_mode(tmp_path: Path) -> None:
    """Reproduced: a run file of ``bench_sptt.py --pipeline on,off --comm-precision fp32,bf16``
    holds four records per mode, and the fit silently took the last of each (unpipelined bf16
    here), while it models pipelined fp32 steps."""
    alone, mixed = tmp_path / "alone.json", tmp_path / "mixed.json"
    ms = {"flat": 200.0, "sptt": 180.0, "dmt": 100.0}
    _run_file(alone, "1gbit", 2048, ms)
    data = json.loads(alone.read_text())
    extra = []
    for pipeline, precision in ((True, "bf16"), (False, "fp32"), (False, "bf16")):
        for r in data["records"]:
            other = {**r, "pipeline": pipeline, "comm_precision": precision}
            extra.append({**other, "ms_per_step_runs": [3 * t for t in r["ms_per_step_runs"]]})
    for r in data["records"]:
        r.update(pipeline=True, comm_precision="fp32")
    mixed.write_text(json.dumps({**data, "records": [*data["records"], *extra]}))
    assert load_run(mixed).measured_ms == load_run(alone).measured_ms == ms

    unpipelined = {**data, "records": [r for r in extra if not r["pipeline"]]}
    mixed.write_text(json.dumps(unpipelined))
    with pytest.raises(ValueError) as refused:
        load_run(mixed)
    assert str(refused.value) == (
        f"{mixed}: no records of modes ['flat', 'sptt', 'dmt'] pipelined at fp32 with "
        "peer_permute 'output' (the fit models pipelined fp32 steps with step c at the output: "
        "bench_sptt.py --pipeline on --comm-precision fp32 --peer-permute output, as "
        "calibration_runs.sh runs it; has [])"
    )
    twice = {**data, "records": [*data["records"], data["records"][0]]}
    mixed.write_text(json.dumps(twice))
    with pytest.raises(ValueError, match=r"two records of mode 'flat' pipelined at fp32"):
        load_run(mixed)


def test_records_of_another_peer_permute_are_refused_naming_that_setting(tmp_path: Path) -> None:
    """Reproduced: a run file whose sptt and dmt records were pipelined at fp32 but measured
    with ``--peer-permute skip`` (bench_sptt.py's default) was refused as having no records
    "pipelined at fp32", asking for ``--pipeline on --comm-precision fp32``, which it had: the
    setting that excluded them, step c's ``peer_permute``, was not named."""
    path = tmp_path / "skip.json"
    _run_file(path, "1gbit", 2048, {"flat": 200.0, "sptt": 180.0, "dmt": 100.0})
    data = json.loads(path.read_text())
    for r in data["records"]:
        r.update(pipeline=True, comm_precision="fp32")
        if r["mode"] != "flat":
            r["peer_permute"] = "skip"
    path.write_text(json.dumps(data))
    with pytest.raises(ValueError) as refused:
        load_run(path)
    assert str(refused.value) == (
        f"{path}: no records of modes ['sptt', 'dmt'] pipelined at fp32 with peer_permute "
        "'output' (the fit models pipelined fp32 steps with step c at the output: "
        "bench_sptt.py --pipeline on --comm-precision fp32 --peer-permute output, as "
        "calibration_runs.sh runs it; has ['flat'])"
    )
