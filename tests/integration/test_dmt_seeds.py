"""scripts/seeds.py and dmt.seeds: repeated seeds, medians and the Mann-Whitney U test (paper Table 6)."""

from __future__ import annotations

import importlib.util
import json
import math
import re
import warnings

import matplotlib.image
import pytest
import torch

from dmt import seeds as seed_lib
from tests.conftest import REPO


def load_driver():
    spec = importlib.util.spec_from_file_location("seeds_driver", REPO / "scripts" / "seeds.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


seeds = load_driver()


def test_summary_and_mann_whitney(tmp_path):
    tp = [0.7990, 0.7987, 0.7993, 0.7991, 0.7989, 0.7995, 0.7986, 0.7992, 0.7988]
    naive = [0.7981, 0.7978, 0.7984, 0.7980, 0.7983, 0.7979, 0.7982, 0.7985, 0.7977]
    s = seed_lib.summarize(tp)
    assert s["n"] == 9 and s["median"] == 0.7990 and s["min"] == 0.7986 and s["max"] == 0.7995
    assert s["std"] == pytest.approx(torch.tensor(tp, dtype=torch.float64).std().item())
    # Every TP run beats every naive run: U = 81 of 81. SciPy's default for 9 runs a config is
    # the normal approximation with continuity correction; the exact p is 2 / C(18, 9).
    c = seed_lib.compare(tp, naive)
    z = (81 - 40.5 - 0.5) / math.sqrt(9 * 9 * 19 / 12)
    assert c["u"] == 81 and c["p_value"] == pytest.approx(math.erfc(z / math.sqrt(2)))
    assert seed_lib.compare(tp, naive, method="exact")["p_value"] == pytest.approx(2 / 48620)
    assert seed_lib.compare(tp, naive, "greater", "exact")["p_value"] == pytest.approx(1 / 48620)
    assert seed_lib.compare(naive, tp)["u"] == 0
    # A reproduced bug: a diverged run's NaN crashed the study after all its training
    # (statistics.stdev), and the median depended on where the NaN stood; now the config's
    # figures are NaN, the runs that diverged are counted, and the report and plot say so.
    nan = float("nan")
    for where in ([nan, *tp[1:]], [*tp[:-1], nan]):
        s = seed_lib.summarize(where)
        assert s["non_finite"] == 1 and s["n"] == 9
        assert all(math.isnan(s[k]) for k in ("median", "std", "mean", "min", "max"))
        c = seed_lib.compare(where, naive)
        assert math.isnan(c["p_value"]) and math.isnan(c["u"])
    report = {
        "metric": "test_auc",
        "seeds": list(range(9)),
        "configs": {"tp": seed_lib.summarize([*tp[:-1], nan]), "naive": seed_lib.summarize(naive)},
        "comparisons": [{"a": "tp", "b": "naive", **seed_lib.compare([*tp[:-1], nan], naive)}],
    }
    text = seed_lib.format_report(report)
    assert "(1 of 9 runs not finite)" in text and "p=nan" in text
    seed_lib.box_plot(report, tmp_path / "nan.png")
    assert (tmp_path / "nan.png").read_bytes()[:4] == b"\x89PNG"
    tied = seed_lib.compare([1.0, 2.0, 3.0], [1.0, 2.0, 3.0])
    assert tied["p_value"] == pytest.approx(1.0)
    with pytest.raises(ValueError, match="needs >= 2 runs"):
        seed_lib.compare([1.0], [2.0, 3.0])
    assert seed_lib.parse_seeds("3") == [0, 1, 2] and seed_lib.parse_seeds("2-4") == [2, 3, 4]
    assert seed_lib.parse_seeds("0,5") == [0, 5]


def test_summary_of_an_even_number_of_runs_and_an_infinite_one():
    """The median of an even number of runs is the mean of the middle two (not the lower one),
    the mean is the mean, and the comparison's median difference is of medians; a run whose
    metric is infinite is not finite either: no figures, no ranks."""
    runs = [0.6, 0.1, 0.3, 0.2]
    s = seed_lib.summarize(runs)
    assert s["median"] == pytest.approx(0.25) and s["mean"] == pytest.approx(0.3)
    assert (s["min"], s["max"]) == (0.1, 0.6) and "non_finite" not in s
    c = seed_lib.compare(runs, [0.0, 0.05, 0.15])
    assert c["u"] == 11 and c["median_difference"] == pytest.approx(0.25 - 0.05)  # 3 + 2 + 3 + 3
    inf = float("inf")
    s = seed_lib.summarize([0.1, inf, 0.3])
    assert s["non_finite"] == 1 and all(math.isnan(s[k]) for k in ("median", "mean", "max"))
    c = seed_lib.compare([0.1, 0.2, -inf], [0.3, 0.4])
    assert math.isnan(c["u"]) and math.isnan(c["p_value"]) and math.isnan(c["median_difference"])


def test_each_seed_once_and_enough_seeds_for_a_comparison(tmp_path, capsys):
    """Reproduced bugs: ``--seeds 3,3,3,0`` read seed 3's run three times (n = 4, the median and
    the test over copies); ``--seeds 1`` with two configs trained every run, then failed in the
    test without a report; ``--seeds 0`` and ``5-3`` were empty and failed after the study."""
    assert seed_lib.parse_seeds("0-2,7,18-19") == [0, 1, 2, 7, 18, 19]
    for text, message in [
        ("3,3,3,0", "--seeds 3,3,3,0: seed(s) [3] given twice"),
        ("0-3,2", "--seeds 0-3,2: seed(s) [2] given twice"),
        ("0", "--seeds 0: give at least 1 seed"),
        ("5-3", "--seeds 5-3: '5-3' is not a seed or a range LO-HI with 0 <= LO <= HI"),
        ("x", "--seeds x: expected K, LO-HI, a comma list, or a list of both"),
    ]:
        with pytest.raises(ValueError) as e:
            seed_lib.parse_seeds(text)
        assert str(e.value) == message
    with pytest.raises(ValueError) as one:
        seed_lib.study({"a": ["optim.lr=0.1"], "b": ["optim.lr=0.2"]}, [0], tmp_path / "one")
    assert str(one.value) == "seeds [0]: comparing configs (Mann-Whitney U) needs at least 2 seeds"
    assert not (tmp_path / "one").exists()  # refused before anything trained
    with pytest.raises(SystemExit):
        seeds.main(["--seeds", "3,3", "--out", str(tmp_path), "--config", "a", "optim.lr=0.1"])
    assert "argument --seeds: 3,3: seed(s) [3] given twice" in capsys.readouterr().err


def test_driver_trains_each_config_per_seed_and_resumes(tmp_path, capsys):
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    tiny = (
        "trainer=smoke trainer.max_steps=4 trainer.eval_max_batches=-1 data.synthetic.num_sparse=4 "
        "data.synthetic.num_groups=2 data.synthetic.num_train=2048 data.synthetic.num_val=512 "
        "data.synthetic.num_test=512 data.batch_size=256"
    )
    argv = [
        "--seeds",
        "2",
        "--out",
        str(tmp_path),
        "--common",
        tiny,
        "--config",
        "dmt",
        "experiment=dmt_4t_dlrm",
        "--config",
        "base",
        "model=dlrm",
    ]
    try:
        report = seeds.main(argv)
    finally:
        torch.set_num_threads(threads)
    out = capsys.readouterr().out
    assert "median test_auc" in out and "Mann-Whitney U (two-sided, auto) dmt vs base" in out
    written = json.loads((tmp_path / "seeds.json").read_text())
    assert written["seeds"] == [0, 1] and list(written["configs"]) == ["dmt", "base"]
    for name in ("dmt", "base"):
        runs = [
            json.loads((tmp_path / name / f"seed_{s}" / "metrics.json").read_text()) for s in (0, 1)
        ]
        assert written["configs"][name]["values"] == [r["test_auc"] for r in runs]
        assert runs[0]["test_auc"] != runs[1]["test_auc"]  # the seed reached the trainer
    assert (
        written["comparisons"][0]["a"] == "dmt" and 0 <= written["comparisons"][0]["p_value"] <= 1
    )
    # the box plot beside the table: one box per config
    png = tmp_path / "seeds.png"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 5_000
    image = matplotlib.image.imread(png)
    assert image.shape == (400, 480, 4) and image[..., :3].std() > 0.05
    # A second call may not replace the first one's summary unless asked, and says so before
    # any run; with --overwrite it reads the runs back instead of training them again.
    before = (tmp_path / "seeds.json").read_bytes()
    with pytest.raises(SystemExit):
        seeds.main(argv)
    assert f"error: {tmp_path / 'seeds.json'} exists (an earlier summary): pass --overwrite " in (
        capsys.readouterr().err
    )
    assert (tmp_path / "seeds.json").read_bytes() == before
    argv = [*argv, "--overwrite"]
    assert seeds.main([*argv, "--no-train"])["configs"] == report["configs"]
    # another metric's summary goes beside it, not over it
    val = seeds.main([*argv[:-1], "--no-train", "--metric", "val_auc"])
    assert json.loads((tmp_path / "seeds_val_auc.json").read_text())["metric"] == "val_auc"
    assert val["configs"]["base"]["values"] != report["configs"]["base"]["values"]
    assert (tmp_path / "seeds_val_auc.png").exists()
    assert json.loads((tmp_path / "seeds.json").read_text())["metric"] == "test_auc"
    with pytest.raises(SystemExit):  # one error line, not a traceback
        seeds.main([*argv[2:], "--seeds", "3", "--no-train"])
    assert (
        f"error: {tmp_path / 'dmt' / 'seed_2' / 'metrics.json'} is missing (run without "
        "--no-train to train it)"
    ) in capsys.readouterr().err
    # a mistyped metric is refused before a run trains (it was a KeyError after the first run)
    fresh = tmp_path / "fresh"
    with pytest.raises(SystemExit):
        seeds.main(["--seeds", "2", "--out", str(fresh), "--common", tiny, "--metric", "test_acu",
                    "--config", "dmt", "experiment=dmt_4t_dlrm"])  # fmt: skip
    assert "error: --metric 'test_acu' is not a metric of config dmt's runs; choose one of [" in (
        capsys.readouterr().err
    )
    assert not fresh.exists()
    # a config given other settings is refused, not reported with the earlier runs' figures
    # (an error line, not a traceback: the traceback was what a user saw)
    other = [*argv[:-3], "base", "model=dlrm optim.lr=0.5", "--overwrite"]
    with pytest.raises(SystemExit):
        seeds.main(other)
    assert re.search(rf"error: {re.escape(str(tmp_path / 'base' / 'seed_0'))} trained with .*"
                     r"'model=dlrm', 'trainer.seed=0'\], but config 'base' is now ",
                     capsys.readouterr().err)  # fmt: skip
    # --pair picks the comparisons (here the reverse of the default), and names must exist
    paired = seeds.main([*argv, "--no-train", "--pair", "base", "dmt"])
    assert [(c["a"], c["b"]) for c in paired["comparisons"]] == [("base", "dmt")]
    assert paired["comparisons"][0]["u"] == 4 - report["comparisons"][0]["u"]
    with pytest.raises(SystemExit):
        seeds.main([*argv, "--no-train", "--pair", "tp", "dmt"])
    assert "error: --pair names unknown config(s) ['tp']; the configs are" in (
        capsys.readouterr().err
    )
    # a run that diverged is no result even where its metric is finite (a saturated model's AUC
    # of 0.5 beside an infinite loss), as the sweepers count it: reproduced, its AUC was summarized
    diverged = tmp_path / "base" / "seed_1" / "metrics.json"
    kept_metrics = diverged.read_text()
    diverged.write_text(json.dumps({**json.loads(kept_metrics), "train_loss_last": math.inf}))
    read = seeds.main([*argv, "--no-train"])["configs"]["base"]
    assert read["non_finite"] == 1 and math.isnan(read["values"][1]) and math.isnan(read["median"])
    assert read["values"][0] == report["configs"]["base"]["values"][0]
    assert "[base seed 1] diverged (train_loss_last=inf): its test_auc " in capsys.readouterr().out
    diverged.write_text(kept_metrics)
    # a study that stopped in a run (its checkpoint saved, its metrics not) goes on from the
    # checkpoint when it runs again: the same figures as the run that was not stopped
    kept = tmp_path / "kept"
    argv_kept = ["--seeds", "1", "--out", str(kept), "--common", f"{tiny} trainer.checkpoint=true"]
    argv_kept += ["--config", "base", "model=dlrm"]
    first = seeds.main(argv_kept)
    run = kept / "base" / "seed_0"
    (run / "metrics.json").unlink()
    saved = {p: p.stat().st_mtime_ns for p in (run / "checkpoints").rglob("*")}
    again = seeds.main([*argv_kept, "--overwrite"])
    assert again["configs"]["base"]["values"] == first["configs"]["base"]["values"]
    assert "trainer.resume_from=auto" in capsys.readouterr().out
    # resumed, not trained again: the checkpoint is the first call's, untouched
    assert {p: p.stat().st_mtime_ns for p in (run / "checkpoints").rglob("*")} == saved
    # a run that failed before anything was kept (a bad setting) holds no settings: once fixed,
    # the same command trains it (its seed_run.json is rewritten, not held against it)
    bad = ["--seeds", "1", "--out", str(tmp_path / "bad"), "--common", tiny]
    with pytest.raises(SystemExit):
        seeds.main([*bad, "--config", "base", "model=dlrm optim.lr=-1"])
    assert "error: optim.lr=-1.0 must be positive" in capsys.readouterr().err
    fixed = seeds.main([*bad, "--config", "base", "model=dlrm optim.lr=0.01"])
    assert len(fixed["configs"]["base"]["values"]) == 1


def test_a_config_named_as_the_summary_is_refused_before_training(tmp_path, capsys):
    """A reproduced bug: ``--config seeds.json ...`` trained every run into OUT/seeds.json/, then
    failed with a FileExistsError traceback writing the summary there, and wrote none."""
    tiny = "trainer=smoke trainer.max_steps=2 data.synthetic.num_sparse=4 data.batch_size=256"
    for name, extra in [("seeds.json", []), ("seeds.png", []), ("val.json", ["--name", "val"])]:
        out = tmp_path / name
        argv = ["--seeds", "1", "--out", str(out), "--common", tiny, *extra]
        with pytest.raises(SystemExit):
            seeds.main([*argv, "--config", name, "model=dlrm"])
        assert _last_error(capsys).endswith(
            f"error: --config {name!r}: a config's name is its directory in --out, and "
            f"{out / name} is the study's summary; give the config another name (or --name "
            "another stem)"
        )
        assert not out.exists()  # refused before anything was written or trained


def _last_error(capsys) -> str:
    """The last line of stderr: the usage error, one line (a traceback would end otherwise)."""
    err = capsys.readouterr().err.strip()
    assert "Traceback" not in err
    return err.splitlines()[-1]


def test_command_line_mistakes_are_one_line_errors_before_anything_is_written(tmp_path, capsys):
    """Reproduced bugs: an unclosed quote in --config or --common (shlex), a misspelt override or
    an unknown config group (Hydra's ConfigCompositionException, 58 lines), --out naming a file
    (NotADirectoryError) were tracebacks; a damaged metrics.json was a JSON message naming no
    file; a config name or --name with '..' or '/' wrote outside --out."""
    out = tmp_path / "study"
    afile = tmp_path / "afile"
    afile.write_text("mine\n")
    for argv, message in [
        (["--config", "a", "trainer=smoke 'x"],
         "error: --config a \"trainer=smoke 'x\": No closing quotation; expected Hydra overrides "
         "in one string"),
        (["--config", "a", "trainer=smoke", "--common", "'x"],
         "error: --common \"'x\": No closing quotation; expected Hydra overrides in one string"),
        (["--config", "a", "trainer.epocs=1"],
         "error: Could not override 'trainer.epocs'. To append to your config use "
         "+trainer.epocs=1: Key 'epocs' not in 'TrainerConfig' full_key: trainer.epocs "
         "reference_type=TrainerConfig object_type=TrainerConfig (config 'a')"),
        (["--config", "a", "model=nonexistent"],
         "error: In 'config': Could not find 'model/nonexistent' Available options in 'model': "
         "base_model dcn dlrm (config 'a')"),
        (["--config", "..", "trainer=smoke"],
         "error: --config '..': a config's name is its directory in --out (OUT/NAME/seed_<S>); "
         "give a single name (no '/', not '.' or '..')"),
        (["--config", "a/../../x", "trainer=smoke"],
         "error: --config 'a/../../x': a config's name is its directory in --out "
         "(OUT/NAME/seed_<S>); give a single name (no '/', not '.' or '..')"),
        (["--config", "a", "trainer=smoke", "--name", "../x"],
         "error: --name '../x': expected a file stem inside --out (no '/', not '.' or '..')"),
    ]:  # fmt: skip
        with pytest.raises(SystemExit) as exit_:
            seeds.main(["--seeds", "2", "--out", str(out), *argv])
        assert exit_.value.code == 2
        assert _last_error(capsys).endswith(message), argv
        assert sorted(p.name for p in tmp_path.iterdir()) == ["afile"]  # nothing written
    for where, message in [
        (afile, f"error: --out {afile} is a file; expected a directory"),
        (afile / "sub", f"error: --out {afile / 'sub'}: {afile} is not a directory"),
    ]:
        with pytest.raises(SystemExit):
            seeds.main(["--seeds", "2", "--out", str(where), "--config", "a", "trainer=smoke"])
        assert _last_error(capsys).endswith(message)
        assert afile.read_text() == "mine\n"
    # a damaged metrics.json is named
    run = out / "a" / "seed_0"
    run.mkdir(parents=True)
    (run / "metrics.json").write_text('{"test_auc": 0.7')
    (run / "seed_run.json").write_text(json.dumps({"overrides": ["x=1", "trainer.seed=0"]}))
    with pytest.raises(SystemExit):
        seeds.main(["--seeds", "1", "--out", str(out), "--config", "a", "x=1", "--no-train"])
    error = _last_error(capsys)
    assert f"error: {run / 'metrics.json'}: not a readable metrics.json (JSONDecodeError: " in error


def test_every_config_is_checked_before_the_first_run_trains(tmp_path, capsys, monkeypatch):
    """Reproduced bug: each config was composed and validated only when its turn came, so a bad
    setting (or a --metric its runs do not report) in the second config stopped the study after
    every run of the first had trained. Stand-in training: only the order is tested."""
    import dmt.train

    trained = []

    def fake_train(cfg, run_dir):
        trained.append(run_dir)
        metrics = {"test_auc": 0.7 + cfg.trainer.seed / 100, "oracle_test_auc": 0.8}
        run_dir.mkdir(parents=True, exist_ok=True)
        (run_dir / "metrics.json").write_text(json.dumps(metrics))
        return metrics

    monkeypatch.setattr(dmt.train, "train", fake_train)
    out = tmp_path / "study"
    base = ["--seeds", "2", "--out", str(out), "--config", "a", "trainer=smoke"]
    with pytest.raises(SystemExit):
        seeds.main([*base, "--config", "b", "trainer=smoke model.embedding_dim=8"])
    assert trained == [] and not out.exists()
    assert _last_error(capsys).endswith("set model.bottom_mlp[-1] to 8 (config 'b')")
    # the metric: oracle_test_auc is a metric of a's runs (planted data evaluated whole), not b's
    planted = "trainer=smoke trainer.eval_max_batches=-1"
    with pytest.raises(SystemExit):
        seeds.main(["--seeds", "2", "--out", str(out), "--metric", "oracle_test_auc",
                    "--config", "a", planted, "--config", "b", "trainer=smoke"])  # fmt: skip
    assert "error: --metric 'oracle_test_auc' is not a metric of config b's runs" in _last_error(
        capsys
    )
    assert trained == [] and not out.exists()
    # with every config valid, every run trains, each config's runs under its name
    report = seeds.main([*base, "--config", "b", "trainer=smoke optim.lr=0.5"])
    assert [p.relative_to(out).as_posix() for p in trained] == [
        "a/seed_0", "a/seed_1", "b/seed_0", "b/seed_1"
    ]  # fmt: skip
    assert report["configs"]["b"]["values"] == [0.7, 0.71]
    capsys.readouterr()


def test_a_validation_metric_of_data_without_validation_rows_is_refused_before_training(
    tmp_path, capsys, monkeypatch
):
    """Reproduced bug: --metric val_auc on data without validation rows
    (data=criteo_sample_holdout) trained every run, then reported each one's NaN as a run that
    is "not finite", as a diverged one is (a sweep refuses that metric before its jobs train).
    Stand-in training: the metrics such a run writes."""
    import dmt.train

    trained = []

    def fake_train(cfg, run_dir):
        trained.append(run_dir)
        metrics = {"val_auc": math.nan, "val_num_samples": 0.0, "test_auc": 0.76}
        run_dir.mkdir(parents=True, exist_ok=True)
        (run_dir / "metrics.json").write_text(json.dumps(metrics))
        return metrics

    monkeypatch.setattr(dmt.train, "train", fake_train)
    raw = tmp_path / "train.tsv"
    raw.write_text("")
    out = tmp_path / "study"
    holdout = f"data=criteo_sample_holdout data.criteo.raw_path={raw}"
    with pytest.raises(SystemExit):
        seeds.main(["--seeds", "2", "--out", str(out), "--metric", "val_auc",
                    "--config", "holdout", holdout])  # fmt: skip
    assert trained == [] and not out.exists()
    assert _last_error(capsys).endswith(
        "error: --metric 'val_auc' with config 'holdout': this data has no validation rows "
        "(data.criteo.split_fractions[1] = 0 or data.criteo.val_split=false, e.g. "
        "data=criteo_sample_holdout), so it would be NaN in every run; choose a metric this data "
        "defines, e.g. --metric test_auc"
    )


def test_a_stopped_run_without_a_record_is_refused_before_anything_trains(tmp_path, monkeypatch):
    """Reproduced: a run directory holding another run's outputs but no metrics.json (a Hydra
    multirun's job that stopped, a run of the user's) got this study's seed_run.json written into
    it, after the runs before it had trained; dmt-train then refused the directory (naming
    hydra.run.dir), and the next call took the run for its own and went on with it. Such a run is
    now refused before anything trains and left as it was; a stopped Hydra job is checked by its
    .hydra/config.yaml and goes on when it ran the config's settings. Stand-in training."""
    from omegaconf import OmegaConf

    import dmt.train
    from dmt.train import compose_config

    trained = []

    def fake_train(cfg, run_dir):
        trained.append((run_dir.name, cfg.trainer.resume_from))
        metrics = {"test_auc": 0.7 + cfg.trainer.seed / 100}
        (run_dir / "metrics.json").write_text(json.dumps(metrics))
        return metrics

    monkeypatch.setattr(dmt.train, "train", fake_train)
    out = tmp_path / "study"
    stopped = out / "a" / "seed_1"
    stopped.mkdir(parents=True)
    (stopped / "history.jsonl").write_text('{"step": 1, "train/loss": 0.69}\n')
    with pytest.raises(ValueError) as e:
        seed_lib.study({"a": ["trainer=smoke"]}, [0, 1], out)
    assert str(e.value) == (
        f"{stopped} holds a run's outputs (history.jsonl) but no seed_run.json or "
        ".hydra/config.yaml that says what it ran (config 'a'): not a run of this study to go on "
        "with; move it out of the study's directory, or choose another --out"
    )
    assert trained == [] and sorted(p.name for p in stopped.iterdir()) == ["history.jsonl"]
    # a Hydra multirun's job that stopped: checked by its record, then it goes on
    (stopped / ".hydra").mkdir()
    ran = compose_config("trainer=smoke", "optim.lr=0.001", "trainer.seed=1")
    OmegaConf.save(ran, stopped / ".hydra" / "config.yaml")
    with pytest.raises(seed_lib.StaleRun, match="optim.lr: 0.001 -> 0.003"):
        seed_lib.study({"a": ["trainer=smoke"]}, [0, 1], out)
    assert trained == [] and not (stopped / "seed_run.json").exists()
    report = seed_lib.study({"a": ["trainer=smoke", "optim.lr=0.001"]}, [0, 1], out)
    assert trained == [("seed_0", None), ("seed_1", "auto")]
    assert report["configs"]["a"]["values"] == [0.7, 0.71]
    assert not (stopped / "seed_run.json").exists()


def test_runs_of_a_hydra_multirun_are_checked_by_their_hydra_record(tmp_path, capsys):
    """Reproduced: a run collected from a Hydra multirun (no seed_run.json) was read with a
    warning only ("a run of an older dmt"), whatever settings it trained with; its
    ``.hydra/config.yaml`` (as Hydra writes it) is now held against the config's, and other
    settings are refused, naming the keys."""
    from omegaconf import OmegaConf

    from dmt.train import compose_config

    out = tmp_path / "study"
    for seed in (0, 1):
        run = out / "a" / f"seed_{seed}"
        (run / ".hydra").mkdir(parents=True)
        ran = compose_config(
            "logger=disabled", "trainer=smoke", "optim.lr=0.001", f"trainer.seed={seed}"
        )
        OmegaConf.save(ran, run / ".hydra" / "config.yaml")
        (run / "metrics.json").write_text(json.dumps({"test_auc": 0.7 + seed / 100}))
    argv = ["--seeds", "2", "--out", str(out), "--no-train", "--config", "a"]
    with pytest.raises(SystemExit):
        seeds.main([*argv, "trainer=smoke optim.lr=0.002"])
    error = _last_error(capsys)
    assert f"error: {out / 'a' / 'seed_0'} trained with another config than 'a''s (" in error
    assert "optim.lr: 0.001 -> 0.002" in error and not (out / "seeds.json").exists()
    # a setting a resume may change, but that changes what evaluation reports
    with pytest.raises(SystemExit):
        seeds.main([*argv, "trainer=smoke optim.lr=0.001 trainer.eval_max_batches=-1"])
    assert _last_error(capsys).endswith(
        "(" + str(out / "a" / "seed_0" / ".hydra" / "config.yaml") + ": trainer.eval_max_batches: "
        "1 -> -1): its metrics are not this config's; choose another --out (or another config name)"
    )
    # the settings the runs trained with (wandb, the default logger, is how they ran: free)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        report = seeds.main([*argv, "trainer=smoke optim.lr=0.001"])
    assert report["configs"]["a"]["values"] == [0.7, 0.71]


def test_runs_whose_partition_file_holds_other_towers_now_are_refused(tmp_path, capsys, one_thread):
    """Reproduced: a study whose tp partition file was replaced (dmt-partition --overwrite, an
    edit) between its calls read back the runs trained on the file's earlier towers and reported
    them as the config's, as the overrides (``model.partition.path``) were the same. A run's
    towers are in its seed_run.json (a Hydra multirun's job: its metrics.json, or an older dmt's
    job its checkpoints' config.yaml), and a file that holds others now is refused, naming the
    run, the file and the towers that changed. Reproduced too: a Hydra multirun's job without a
    checkpoint was read back with a warning only, as nothing recorded its towers."""
    from omegaconf import OmegaConf

    from dmt.train import compose_config, train

    trained = [["cat_0", "cat_3"], ["cat_1", "cat_2"]]
    other = [["cat_0", "cat_1"], ["cat_2", "cat_3"]]
    tp = tmp_path / "tp.yaml"
    tp.write_text(json.dumps({"towers": trained}))
    tiny = ["trainer=smoke", "trainer.max_steps=2", "data.synthetic.num_sparse=4",
            "data.synthetic.num_train=512", "data.synthetic.num_val=256",
            "data.synthetic.num_test=256", "data.batch_size=256"]  # fmt: skip
    config = ["experiment=dmt_4t_dlrm", "partition=tp", f"model.partition.path={tp}"]
    config += ["model.partition.num_towers=null"]
    out = tmp_path / "study"
    argv = ["--seeds", "1", "--out", str(out), "--common", " ".join(tiny)]
    argv += ["--config", "tp", " ".join(config), "--overwrite"]
    first = seeds.main(argv)
    run = out / "tp" / "seed_0"
    for towers, change in [
        (other, "tower 0: [cat_0, cat_3] -> [cat_0, cat_1]; tower 1: [cat_1, cat_2] -> [cat_2, cat_3]"),
        ([t[::-1] for t in trained], "tower 0: [cat_0, cat_3] -> [cat_3, cat_0] (the same features in another order); tower 1: [cat_1, cat_2] -> [cat_2, cat_1] (the same features in another order)"),
    ]:  # fmt: skip
        tp.write_text(json.dumps({"towers": towers}))
        with pytest.raises(SystemExit):
            seeds.main(argv)
        assert _last_error(capsys).endswith(
            f"error: {run} trained with other towers than partition file {str(tp)!r} holds now "
            f"({run / 'seed_run.json'}: {change}): its metrics are not config 'tp''s; choose "
            "another --out (or another config name), or put the file's towers back"
        )
    assert json.loads((run / "seed_run.json").read_text())["partition"] == {
        "path": str(tp),
        "towers": trained,
    }
    tp.write_text(json.dumps({"towers": trained}))  # put back: the runs are read, not trained
    values = seeds.main([*argv, "--no-train"])["configs"]["tp"]["values"]
    assert values == first["configs"]["tp"]["values"]
    # a Hydra multirun's job (its .hydra/config.yaml names only the file): the towers its
    # metrics.json records, with or without a checkpoint (a multirun's job keeps none unless
    # told to); a run of an older dmt, whose metrics.json has none, by its checkpoint's
    # config.yaml; without either, they cannot be checked, and it says so
    job = tmp_path / "sweep" / "tp" / "seed_0"
    settings = [*tiny, *config, "trainer.seed=0"]
    train(compose_config(*settings, "logger=disabled", "trainer.checkpoint=true"), job)
    (job / ".hydra").mkdir()
    OmegaConf.save(compose_config(*settings), job / ".hydra" / "config.yaml")
    tp.write_text(json.dumps({"towers": other}))
    metrics = job / "metrics.json"
    recorded = json.loads(metrics.read_text())
    assert recorded["model.partition.recorded_towers"] == trained
    older = {k: v for k, v in recorded.items() if k != "model.partition.recorded_towers"}
    saved = job / "checkpoints" / "step_2" / "config.yaml"

    def refused_by(source):
        with pytest.raises(seed_lib.StaleRun) as e:
            seed_lib.study({"tp": [*tiny, *config]}, [0], tmp_path / "sweep", train_missing=False)
        assert str(e.value).startswith(
            f"{job} trained with other towers than partition file {str(tp)!r} holds now "
            f"({source}: tower 0: [cat_0, cat_3] -> [cat_0, cat_1]"
        )

    refused_by(metrics)
    metrics.write_text(json.dumps(older))  # an older dmt's job
    refused_by(saved)
    for step in (job / "checkpoints").iterdir():
        for f in step.iterdir():
            f.unlink()
        step.rmdir()
    metrics.write_text(json.dumps(recorded))  # a job without a checkpoint
    refused_by(metrics)
    metrics.write_text(json.dumps(older))  # an older dmt's job without a checkpoint
    with pytest.warns(UserWarning) as caught:
        seed_lib.study({"tp": [*tiny, *config]}, [0], tmp_path / "sweep", train_missing=False)
    assert str(caught[0].message) == (
        f"{job}: no seed_run.json, metrics.json or checkpoint records the towers it trained "
        f"with: its towers cannot be checked against partition file {str(tp)!r} of config 'tp'; "
        "its metrics are read as they are"
    )
