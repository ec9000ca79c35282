"""A sweep's trials table (dmt.trials) on fake sweep directories, and the hparams_search configs."""

from __future__ import annotations

import csv
import importlib.util
import itertools
import json
import math
from pathlib import Path
from typing import Any

import pytest
import yaml
from hydra import compose, initialize_config_module
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.utils import instantiate
from omegaconf import OmegaConf

from dmt.train import CONF_MODULE
from dmt.trials import (
    TRIALS_CSV,
    TRIALS_MD,
    TRIALS_PNG,
    Trial,
    TrialsTable,
    best_row,
    divergence,
    override_list,
    read_trials,
    reads_the_model,
    top_trials,
    trials_table,
    write_trials,
)
from tests.conftest import REPO, typed_config

#: made-up trials: number -> (optim.lr, val_auc); None: the trial wrote no metrics.json
FAKE = {
    0: ("0.001", 0.71),
    1: ("0.002", 0.74),
    2: ("0.004", None),
    3: ("0.003", 0.73),
    4: ("0.0005", float("nan")),
    10: ("0.0025", 0.75),
    11: ("0.0001", 0.70),
}


def fake_sweep(root: Path, trials: dict[int, tuple[str, float | None]] = FAKE) -> Path:
    """A sweep directory as Hydra and dmt-train leave it (made-up numbers, not a real run)."""
    for number in sorted(trials, key=str):  # created out of numeric order
        lr, auc = trials[number]
        run = root / str(number)
        (run / ".hydra").mkdir(parents=True)
        overrides = [f"optim.lr={lr}", "hparams_search=criteo_forward_dlrm", "trainer=smoke"]
        (run / ".hydra" / "overrides.yaml").write_text(yaml.safe_dump(overrides))
        (run / ".hydra" / "hydra.yaml").write_text(
            yaml.safe_dump({"hydra": {"job": {"num": number}}})
        )
        if auc is not None:
            metrics = {
                "val_auc": auc,
                "val_logloss": 0.5 + number / 100,
                "val_num_samples": 100.0,
                "test_auc": 0.6,
                "train_samples_per_s": 1000.0 + number,
            }
            (run / "metrics.json").write_text(json.dumps(metrics))
    (root / "optimization_results.yaml").write_text("name: optuna\n")  # not a trial
    return root


def test_write_trials_table_csv_markdown_and_plot(tmp_path: Path) -> None:
    sweep = fake_sweep(tmp_path / "sweep")
    written = write_trials(sweep, "val_auc")
    assert written == [sweep / TRIALS_CSV, sweep / TRIALS_MD, sweep / TRIALS_PNG]

    with open(sweep / TRIALS_CSV, newline="") as f:
        rows = list(csv.DictReader(f))
    numbers = sorted(FAKE)
    assert [int(r["trial"]) for r in rows] == numbers
    # the parameter columns are the overrides that vary; no test metric, no sample count
    assert list(rows[0]) == [
        "trial",
        "status",
        "val_auc",
        "best_so_far",
        "optim.lr",
        "train_samples_per_s",
        "val_logloss",
    ]
    ok = {n: auc for n, (_, auc) in FAKE.items() if auc is not None and not math.isnan(auc)}
    for r, n in zip(rows, numbers):
        assert r["optim.lr"] == FAKE[n][0]
        assert r["status"] == ("ok" if n in ok else "failed")
        assert r["val_auc"] == (repr(ok[n]) if n in ok else "")
        assert r["val_logloss"] == (repr(0.5 + n / 100) if n in ok else "")
    best_so_far = list(itertools.accumulate((ok.get(n, -math.inf) for n in numbers), max))
    assert [float(r["best_so_far"]) if r["best_so_far"] else -math.inf for r in rows] == best_so_far
    best = max(ok, key=ok.__getitem__)
    assert best == 10 and float(rows[numbers.index(best)]["val_auc"]) == max(ok.values())

    md = (sweep / TRIALS_MD).read_text().splitlines()
    assert md[0] == "Best of 7 trials (2 failed): trial 10, val_auc 0.7500: `optim.lr=0.0025`"
    assert md[2] == (
        "| trial | status | val_auc | best_so_far | optim.lr | train_samples_per_s | val_logloss |"
    )
    assert md[4] == "| 0 | ok | 0.7100 | 0.7100 | 0.001 | 1000 | 0.5000 |"
    assert md[6] == "| 2 | failed |  | 0.7400 | 0.004 |  |  |"  # best so far: trial 1
    assert len(md) == 4 + len(FAKE)
    assert (sweep / TRIALS_PNG).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_minimize_picks_the_lowest(tmp_path: Path) -> None:
    sweep = fake_sweep(tmp_path / "sweep")
    columns, rows = trials_table(read_trials(sweep), "val_logloss", maximize=False)
    assert columns[2:4] == ["val_logloss", "best_so_far"]
    ok = [r for r in rows if r["status"] == "ok"]
    assert [r["best_so_far"] for r in ok] == [0.5] * len(ok)  # trial 0 has the lowest
    write_trials(sweep, "val_logloss", maximize=False)
    md = (sweep / TRIALS_MD).read_text()
    # trial 4 has a NaN AUC but a logloss: it failed only for an AUC sweep
    assert md.startswith("Best of 7 trials (1 failed): trial 0, val_logloss 0.5000")


def test_every_trial_failed(tmp_path: Path) -> None:
    sweep = fake_sweep(tmp_path / "sweep", {0: ("0.1", None), 1: ("0.2", None)})
    write_trials(sweep, "val_auc")
    md = (sweep / TRIALS_MD).read_text().splitlines()
    assert md[0] == "no trial has a value of 'val_auc': every trial failed"
    assert (sweep / TRIALS_PNG).is_file()


def test_no_trials_writes_nothing(tmp_path: Path) -> None:
    assert write_trials(tmp_path, "val_auc") == []
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    "direction,best",
    [
        (None, 10),
        ("maximize", 10),
        ("minimize", 11),
        (["minimize"], 11),
        (["minimize", "maximize"], 11),
    ],
)
def test_callback_follows_the_sweepers_direction(
    tmp_path: Path, direction: object, best: int
) -> None:
    sweep = fake_sweep(tmp_path / "sweep")
    hydra: dict[str, object] = {"sweep": {"dir": str(sweep)}}
    if direction is not None:
        hydra["sweeper"] = {"direction": direction}
    config = OmegaConf.create({"hydra": hydra, "trainer": {"optimize_metric": "val_auc"}})
    TrialsTable().on_multirun_end(config)
    assert (sweep / TRIALS_MD).read_text().startswith(f"Best of 7 trials (2 failed): trial {best},")


def test_only_rank_0_writes_the_trials_table(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every rank of ``srun dmt-train -m`` runs the callback; a rank other than 0 may end its
    last trial before rank 0 has written that trial's metrics.json, so it writes nothing."""
    sweep = fake_sweep(tmp_path / "sweep")
    config = OmegaConf.create({"hydra": {"sweep": {"dir": str(sweep)}}})
    for key in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", "29500")
    TrialsTable().on_multirun_end(config)
    assert not (sweep / TRIALS_MD).exists()
    monkeypatch.setenv("RANK", "0")
    TrialsTable().on_multirun_end(config)
    assert (sweep / TRIALS_MD).read_text().startswith("Best of 7 trials (2 failed): trial 10,")


# -- confirming the best trials over more seeds (scripts/confirm_trials.py) -------------------


def test_top_trials_best_first_without_the_failed(tmp_path: Path) -> None:
    trials = read_trials(fake_sweep(tmp_path))
    assert [t.number for t in top_trials(trials, "val_auc", 3)] == [10, 1, 3]
    assert [t.number for t in top_trials(trials, "val_auc", 100)] == [10, 1, 3, 0, 11]
    assert [t.number for t in top_trials(trials, "val_auc", 2, maximize=False)] == [11, 0]
    best = top_trials(trials, "val_auc", 1)[0]
    assert override_list(best) == [
        "optim.lr=0.0025",
        "hparams_search=criteo_forward_dlrm",
        "trainer=smoke",
    ]
    with pytest.raises(ValueError, match=r"^k=0 must be >= 1$"):
        top_trials(trials, "val_auc", 0)
    failed = read_trials(fake_sweep(tmp_path / "failed", {0: ("0.001", None)}))
    with pytest.raises(ValueError, match="no trial has a value of 'val_auc': every trial failed"):
        top_trials(failed, "val_auc", 1)
    # a mistyped metric is named as such (it read "every trial failed")
    with pytest.raises(ValueError) as mistyped:
        top_trials(trials, "val_acu", 1)
    keys = sorted({k for t in trials if t.metrics is not None for k in t.metrics})
    assert str(mistyped.value) == f"no trial's metrics.json has 'val_acu'; they have {keys}"


def test_a_diverged_trial_with_a_finite_metric_is_failed_not_ranked(tmp_path: Path) -> None:
    """A reproduced bug: a trial whose training loss became inf (``optim.lr=1e6``: saturated
    logits, AUC 0.5, a finite logloss) was an ``ok`` trial with its AUC, best so far and among
    the top trials that ``scripts/confirm_trials.py`` runs again; its ``metrics.json`` says it
    diverged (``train_loss_last`` not finite), and it fails as a NaN AUC does."""
    sweep = fake_sweep(tmp_path / "sweep", {0: ("0.001", 0.4), 1: ("1e6", 0.5)})
    diverged = sweep / "1" / "metrics.json"
    metrics = {**json.loads(diverged.read_text()), "train_loss_last": math.inf}
    metrics["train_samples_per_s"] = 123.0
    diverged.write_text(json.dumps(metrics))  # Python's json, as dmt-train's: Infinity
    trials = read_trials(sweep)
    assert trials[1].value("train_samples_per_s") == 123.0  # its throughput is still that
    _, rows = trials_table(trials, "val_auc")
    assert [(r["status"], r["val_auc"], r["best_so_far"], r["val_logloss"]) for r in rows] == [
        ("ok", 0.4, 0.4, 0.5),
        ("failed", None, 0.4, None),
    ]
    assert [t.number for t in top_trials(trials, "val_auc", 2)] == [0]
    write_trials(sweep, "val_auc")
    summary = (sweep / TRIALS_MD).read_text().splitlines()[0]
    assert summary == "Best of 2 trials (1 failed): trial 0, val_auc 0.4000: `optim.lr=0.001`"


def test_what_shows_that_a_run_diverged(tmp_path: Path) -> None:
    """:func:`divergence` as documented: a training loss that is not finite (unless the
    throughput is NaN too: an attempt that trained nothing), or a NaN logloss of either split
    over rows (a split without rows has a NaN logloss and nothing diverged); a metric that is
    not finite, infinite too, is a failed trial."""
    nan = math.nan
    fine = {"train_loss_last": 0.45, "train_samples_per_s": 900.0, "val_num_samples": 100.0}
    fine |= {"val_logloss": 0.47, "test_num_samples": 50.0, "test_logloss": 0.48}
    assert divergence(fine) is None
    assert divergence({**fine, "train_loss_last": nan}) == "train_loss_last=nan"
    assert divergence({**fine, "train_loss_last": nan, "train_samples_per_s": nan}) is None
    assert divergence({**fine, "test_logloss": nan}) == (
        "train_loss_last=0.45, but test_logloss=nan over 50 rows: its predictions are not finite"
    )
    assert divergence({**fine, "val_num_samples": 0.0, "val_logloss": nan}) is None
    assert reads_the_model("train_loss_last") and reads_the_model("test_auc")
    assert not reads_the_model("train_samples_per_s")
    assert divergence({**fine, "test_logloss": nan}, "train_loss_last") is not None
    assert Trial(0, tmp_path, {}, {**fine, "val_auc": math.inf}).value("val_auc") is None
    assert Trial(0, tmp_path, {}, {**fine, "val_auc": 0.7}).value("val_auc") == 0.7


def test_the_best_row_is_the_first_of_equal_ones_and_ties_rank_by_trial_number() -> None:
    rows = [{"trial": t, "val_auc": v} for t, v in [(0, 0.70), (1, 0.72), (2, None), (3, 0.72)]]
    assert best_row(rows, "val_auc")["trial"] == 1
    rows[1]["val_auc"] = 0.68
    assert best_row(rows, "val_auc", maximize=False)["trial"] == 1
    rows[3]["val_auc"] = 0.68
    assert best_row(rows, "val_auc", maximize=False)["trial"] == 1
    # top_trials: ties by the lower trial number, whatever order the trials come in
    trials = [
        Trial(n, Path(str(n)), {}, {"val_auc": v}) for n, v in [(3, 0.72), (1, 0.72), (0, 0.7)]
    ]
    assert [t.number for t in top_trials(trials, "val_auc", 2)] == [1, 3]
    assert [t.number for t in top_trials(trials, "val_auc", 3, maximize=False)] == [0, 1, 3]


def _confirm_driver() -> Any:
    spec = importlib.util.spec_from_file_location(
        "confirm_trials", REPO / "scripts" / "confirm_trials.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_confirm_trials_chooses_on_the_median_over_seeds(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    sweep = fake_sweep(tmp_path / "sweep")
    out = tmp_path / "confirm"
    # the confirming runs are already there (read back, not rerun): trial 10 won the sweep
    # (0.75) on a lucky seed; over seeds 1-3 trial 1 (0.74 in the sweep) is better
    for number, values in {10: [0.70, 0.72, 0.71], 1: [0.73, 0.74, 0.72]}.items():
        for seed, value in zip((1, 2, 3), values, strict=True):
            run = out / f"trial{number}" / f"seed_{seed}"
            run.mkdir(parents=True)
            (run / "metrics.json").write_text(json.dumps({"val_auc": value}))
    confirm = _confirm_driver()
    result = confirm.main([str(sweep), "--top", "2", "--out", str(out)])
    assert [r["config"] for r in result["ranking"]] == ["trial1", "trial10"]
    chosen = result["chosen"]
    assert (chosen["config"], chosen["median"], chosen["sweep_value"]) == ("trial1", 0.73, 0.74)
    assert chosen["values"] == [0.73, 0.74, 0.72]
    assert chosen["overrides"] == [
        "optim.lr=0.002",
        "hparams_search=criteo_forward_dlrm",
        "trainer=smoke",
    ]
    assert json.loads((out / "confirm.json").read_text()) == result
    assert (out / "seeds.json").is_file() and (out / "seeds.png").is_file()
    capsys.readouterr()
    with pytest.raises(SystemExit):  # a second run does not replace the first one's choice
        confirm.main([str(sweep), "--top", "2", "--out", str(out)])
    assert f"{out / 'confirm.json'} exists (--overwrite to replace it)" in capsys.readouterr().err
    again = confirm.main([str(sweep), "--top", "2", "--out", str(out), "--overwrite"])
    assert again == result
    # nor the table and plot of its seeds, which an earlier study in OUT may have left alone
    (out / "confirm.json").unlink()
    table = (out / "seeds.json").read_bytes()
    with pytest.raises(SystemExit):
        confirm.main([str(sweep), "--top", "2", "--out", str(out)])
    assert f"{out / 'seeds.json'} exists (--overwrite to replace it)" in capsys.readouterr().err
    assert (out / "seeds.json").read_bytes() == table and not (out / "confirm.json").exists()


def test_confirm_trials_refuses_the_sweeps_seed_and_a_single_seed(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    sweep = fake_sweep(tmp_path / "sweep")
    (sweep / "10" / ".hydra" / "config.yaml").write_text(yaml.safe_dump({"trainer": {"seed": 2}}))
    confirm = _confirm_driver()
    with pytest.raises(SystemExit):
        confirm.main([str(sweep), "--top", "2", "--seeds", "1-3", "--out", str(tmp_path / "c")])
    assert (
        "--seeds [1, 2, 3] include the seed(s) [2] the sweep scored its trials with; "
        "confirm with other seeds" in capsys.readouterr().err
    )
    with pytest.raises(SystemExit):
        confirm.main([str(sweep), "--seeds", "5-5", "--out", str(tmp_path / "c")])
    assert "a median and a comparison need at least 2 seeds" in capsys.readouterr().err
    assert not (tmp_path / "c").exists()  # refused before any run


def test_confirm_ranking_puts_a_diverged_config_last() -> None:
    configs = {
        "a": {"median": float("nan"), "std": 0.0, "values": [], "overrides": ["x=1"]},
        "b": {"median": 0.70, "std": 0.0, "values": [], "overrides": ["x=2"]},
        "c": {"median": 0.72, "std": 0.0, "values": [], "overrides": ["x=3"]},
    }
    rank = _confirm_driver().rank
    values = {"a": 0.8, "b": 0.7, "c": None}
    assert [r["config"] for r in rank({"configs": configs}, values, maximize=True)] == [
        "c",
        "b",
        "a",
    ]
    assert [r["config"] for r in rank({"configs": configs}, values, maximize=False)] == [
        "b",
        "c",
        "a",
    ]


# -- conf/hparams_search ------------------------------------------------------------------------

SEARCHES = sorted(p.stem for p in (REPO / "dmt" / "conf" / "hparams_search").glob("*.yaml"))


def search_space(params: dict[str, str]) -> dict[str, list[object]]:
    """Each swept key's corner values: every choice, or an interval's two ends."""
    parser = OverridesParser.create()
    space: dict[str, list[object]] = {}
    for key, value in params.items():
        override = parser.parse_override(f"{key}={value}")
        if override.is_choice_sweep():
            space[key] = list(override.sweep_iterator())
        else:
            assert override.is_interval_sweep(), (key, value)
            space[key] = [override.value().start, override.value().end]
    return space


@pytest.mark.parametrize("name", SEARCHES)
def test_hparams_search_composes_with_the_optuna_sweeper(name: str) -> None:
    assert SEARCHES == ["criteo_forward_dcn", "criteo_forward_dlrm", "criteo_forward_dmt_dlrm"]
    with initialize_config_module(CONF_MODULE, version_base="1.3"):
        cfg = compose("config", [f"hparams_search={name}"], return_hydra_config=True)
    sweeper = cfg.hydra.sweeper
    assert sweeper._target_ == "hydra_plugins.hydra_optuna_sweeper.optuna_sweeper.OptunaSweeper"
    assert sweeper.direction == "maximize" and sweeper.n_trials == 40
    assert cfg.trainer.optimize_metric == "val_auc"
    assert cfg.hydra.runtime.choices["data"] == "criteo_sample_forward"
    model = name.removeprefix("criteo_forward_")
    assert cfg.hydra.runtime.choices["model"] == model.removeprefix("dmt_")
    if model.startswith("dmt_"):  # towers: the DMT form of the model
        assert cfg.model.partition.kind != "none" and cfg.model.partition.num_towers > 1
    sampler = instantiate(sweeper.sampler)
    assert type(sampler).__name__ == "TPESampler"
    params = OmegaConf.to_container(sweeper.params, resolve=True)
    assert isinstance(params, dict) and params
    space = search_space({str(k): str(v) for k, v in params.items()})
    for key in space:  # only keys the config has (a typo would add nothing to a trial)
        assert OmegaConf.select(cfg, key, throw_on_missing=True) is not None, key
    # every corner of the space is a valid config: the i-th choice (or interval end) of each key
    for i in range(max(len(v) for v in space.values())):
        corner = [f"{k}={v[i % len(v)]}" for k, v in space.items()]
        conf = typed_config(f"hparams_search={name}", *corner)
        assert conf.data.criteo is not None
        assert conf.data.criteo.split_fractions == [0.8, 0.1, 0.1]
        if model.startswith("dmt_"):  # the dense vector joins the towers' D-sized vectors
            assert conf.model.tower is not None
            assert conf.model.bottom_mlp[-1] == conf.model.tower.dim


def _trial(root: Path, directory: str, number: int, overrides: list[str], auc: float) -> None:
    run = root / directory
    (run / ".hydra").mkdir(parents=True)
    (run / ".hydra" / "overrides.yaml").write_text(yaml.safe_dump(overrides))
    (run / ".hydra" / "hydra.yaml").write_text(yaml.safe_dump({"hydra": {"job": {"num": number}}}))
    (run / "metrics.json").write_text(json.dumps({"val_auc": auc}))


def test_sampled_settings_are_columns_even_when_every_trial_drew_them_alike(
    tmp_path: Path,
) -> None:
    """A reproduced bug: the columns were the overrides that differ between trials, so a sweep
    of one trial (or whose trials all drew a setting alike) named no settings at all."""
    sweep = tmp_path / "sweep"
    _trial(sweep, "0", 0, ["data.batch_size=256", "model.embedding_dim=8", "optim.lr=0.0021"], 0.7)
    config = OmegaConf.create(
        {
            "hydra": {
                "mode": "MULTIRUN",
                "sweep": {"dir": str(sweep)},
                "sweeper": {"params": {"model.embedding_dim": "choice(8,16)"}},
                "overrides": {"task": ["data.batch_size=256", "optim.lr=interval(0.001,0.01)"]},
            },
            "trainer": {"optimize_metric": "val_auc"},
        }
    )
    TrialsTable().on_multirun_end(config)
    with open(sweep / TRIALS_CSV, newline="") as f:
        rows = list(csv.DictReader(f))
    assert list(rows[0]) == ["trial", "status", "val_auc", "best_so_far", "model.embedding_dim",
                             "optim.lr"]  # fmt: skip
    assert (sweep / TRIALS_MD).read_text().splitlines()[0] == (
        "Best of 1 trials (0 failed): trial 0, val_auc 0.7000: `model.embedding_dim=8`, "
        "`optim.lr=0.0021`"
    )


def test_the_table_is_written_after_every_job_of_a_multirun(tmp_path: Path) -> None:
    """A sweep the Optuna sweeper stops (every trial failed: 'No trials are completed yet') never
    reaches on_multirun_end; the table of its trials is there from the jobs' ends."""
    sweep = fake_sweep(tmp_path / "sweep")
    job = {"sweep": {"dir": str(sweep)}, "sweeper": {"params": {"optim.lr": "choice(1,2)"}}}
    config = OmegaConf.create({"hydra": {**job, "mode": "RUN"}})
    TrialsTable().on_job_end(config, job_return=None)
    assert not (sweep / TRIALS_MD).exists()  # a single run: no sweep, no table
    config = OmegaConf.create({"hydra": {**job, "mode": "MULTIRUN"}})
    TrialsTable().on_job_end(config, job_return=None)
    assert (sweep / TRIALS_MD).read_text().startswith("Best of 7 trials (2 failed): trial 10,")
    # a key swept on the command line is in the multirun's config, not the job's (the job has
    # its own value): the callback keeps it from the multirun's start for the jobs' tables
    one = tmp_path / "one"
    _trial(one, "0", 0, ["data.batch_size=256", "optim.lr=1"], 0.7)
    table = TrialsTable()
    multirun = {"sweep": {"dir": str(one)}, "mode": "MULTIRUN"}
    table.on_multirun_start(
        OmegaConf.create({"hydra": {**multirun, "overrides": {"task": ["optim.lr=choice(1,2)"]}}})
    )
    table.on_job_end(
        OmegaConf.create({"hydra": {**multirun, "overrides": {"task": ["optim.lr=1"]}}}),
        job_return=None,
    )
    assert (one / TRIALS_MD).read_text().splitlines()[0].endswith(": `optim.lr=1`")
    assert sorted(p.name for p in sweep.iterdir() if p.name.startswith(".")) == []  # no temporary


def test_an_interpolation_in_the_sweeps_overrides_is_the_jobs_to_resolve(tmp_path: Path) -> None:
    """A reproduced bug: a sweep over the frequency threshold with the data elsewhere
    (``data.criteo.preprocessed_dir='/data/t${.frequency_threshold}'``, as the data configs
    name it) warned "Callback TrialsTable.on_multirun_start raised InterpolationResolutionError"
    and the same at its end: the callback resolved the multirun's overrides, relative to their
    list. It lost the keys swept on the command line, and the table the multirun's end writes."""
    sweep = fake_sweep(tmp_path / "sweep")
    task = ["optim.lr=choice(1,2)", "data.criteo.preprocessed_dir=/data/t${.frequency_threshold}"]
    config = OmegaConf.create(
        {
            "hydra": {
                "sweep": {"dir": str(sweep)},
                "mode": "MULTIRUN",
                "overrides": {"task": task},
            },
            "trainer": {"optimize_metric": "val_auc"},
        }
    )
    table = TrialsTable()
    table.on_multirun_start(config)
    assert table.swept == ["optim.lr"]
    table.on_multirun_end(config)
    assert (sweep / TRIALS_MD).read_text().startswith("Best of 7 trials (2 failed): trial 10,")


def test_the_best_trial_is_named_by_the_settings_it_had(tmp_path: Path) -> None:
    """A reproduced bug: seeds added to a study (README: ``hydra.sweep.subdir=seed_${trainer.seed}``)
    make ``trainer.seed`` a column; the best trial, which set no seed, was summarised with
    ``trainer.seed=None``, an override it never had (and that Hydra reads as the string "None")."""
    sweep = tmp_path / "sweep"
    _trial(sweep, "0", 0, ["optim.lr=0.001"], 0.74)
    _trial(sweep, "1", 1, ["optim.lr=0.002"], 0.72)
    _trial(sweep, "seed_5", 0, ["trainer.seed=5"], 0.73)
    write_trials(sweep, "val_auc")
    assert (sweep / TRIALS_MD).read_text().splitlines()[0] == (
        "Best of 3 trials (0 failed): trial 0 (0), val_auc 0.7400: `optim.lr=0.001`"
    )


def test_two_multiruns_in_one_sweep_directory_are_told_apart(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A reproduced bug: a second multirun into a sweep directory (seeds added with
    ``hydra.sweep.subdir=seed_${trainer.seed}``) numbers its jobs from 0 again; the table showed
    two trials of each number, and confirm_trials named configs by number, so one trial replaced
    another (--top 4 confirmed 3)."""
    sweep = tmp_path / "sweep"
    for directory, number, lr, auc in [
        ("seed_1", 0, "0.001", 0.72),
        ("seed_2", 1, "0.002", 0.71),
        ("seed_3", 0, "0.003", 0.74),
        ("seed_4", 1, "0.004", 0.73),
    ]:
        _trial(sweep, directory, number, [f"optim.lr={lr}", f"trainer.seed={directory[-1]}"], auc)
    columns, rows = trials_table(read_trials(sweep), "val_auc", sweep_dir=sweep)
    assert columns[:3] == ["trial", "run", "status"]
    write_trials(sweep, "val_auc")
    assert (
        (sweep / TRIALS_MD).read_text().startswith("Best of 4 trials (0 failed): trial 0 (seed_3),")
    )
    assert [(r["trial"], r["run"]) for r in rows] == [
        (0, "seed_1"), (0, "seed_3"), (1, "seed_2"), (1, "seed_4")
    ]  # fmt: skip
    # without shared numbers, no run column
    assert "run" not in trials_table(read_trials(fake_sweep(tmp_path / "one")), "val_auc",
                                     sweep_dir=tmp_path / "one")[0]  # fmt: skip
    out = tmp_path / "confirm"
    for name in ("seed_1", "seed_2", "seed_3", "seed_4"):
        for seed in (5, 6):
            run = out / name / f"seed_{seed}"
            run.mkdir(parents=True)
            (run / "metrics.json").write_text(json.dumps({"val_auc": 0.7 + int(name[-1]) / 100}))
    result = _confirm_driver().main([str(sweep), "--top", "4", "--seeds", "5,6", "--out", str(out)])
    assert sorted(r["config"] for r in result["ranking"]) == [
        "seed_1",
        "seed_2",
        "seed_3",
        "seed_4",
    ]
    capsys.readouterr()


def test_a_run_without_a_trial_number_is_named(tmp_path: Path) -> None:
    """A directory of the sweep with Hydra's overrides but neither hydra.yaml nor a numeric
    name failed with a bare "invalid literal for int() with base 10: 'run'"."""
    sweep = fake_sweep(tmp_path / "sweep")
    stray = sweep / "extra" / "run"
    (stray / ".hydra").mkdir(parents=True)
    (stray / ".hydra" / "overrides.yaml").write_text(yaml.safe_dump(["optim.lr=1"]))
    with pytest.raises(ValueError) as e:
        read_trials(sweep)
    assert str(e.value) == (
        f"{stray}: holds .hydra/overrides.yaml but no trial number (expected hydra.job.num in "
        ".hydra/hydra.yaml, or a directory named by the number): ValueError: invalid literal for "
        "int() with base 10: 'run'; move what is not a trial of the sweep out of its directory"
    )


def test_confirm_trials_mistakes_are_one_line_errors(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Reproduced bugs, each a traceback: an unclosed quote in --common (shlex), a misspelt
    override in --common (Hydra's ConfigCompositionException), a folder of the sweep that is no
    trial, a damaged metrics.json (a JSONDecodeError naming no file), --out naming a file."""
    sweep = fake_sweep(tmp_path / "sweep")
    out = tmp_path / "c"
    afile = tmp_path / "afile"
    afile.write_text("mine\n")
    confirm = _confirm_driver()

    def error(*argv: str) -> str:
        with pytest.raises(SystemExit) as exit_:
            confirm.main([str(sweep), "--top", "1", "--seeds", "5,6", *argv])
        assert exit_.value.code == 2
        err = capsys.readouterr().err.strip()
        assert "Traceback" not in err
        return err.splitlines()[-1]

    assert error("--out", str(out), "--common", "trainer=smoke 'x").endswith(
        'error: --common "trainer=smoke \'x": No closing quotation; expected Hydra overrides in '
        "one string"
    )
    assert error("--out", str(out), "--common", "trainer.epocs=3").endswith(
        "error: Could not override 'trainer.epocs'. To append to your config use +trainer.epocs=3: "
        "Key 'epocs' not in 'TrainerConfig' full_key: trainer.epocs reference_type=TrainerConfig "
        "object_type=TrainerConfig (config 'trial10')"
    )
    assert not out.exists()  # refused before a run
    assert error("--out", str(afile)).endswith(
        f"error: --out {afile} is a file; expected a directory"
    )
    assert error("--out", str(afile / "sub")).endswith(
        f"error: --out {afile / 'sub'}: {afile} is not a directory"
    )
    assert afile.read_text() == "mine\n"
    extra = sweep / "extra"
    (extra / ".hydra").mkdir(parents=True)
    (extra / ".hydra" / "overrides.yaml").write_text(yaml.safe_dump(["optim.lr=1"]))
    assert error("--out", str(out)).endswith(
        f"error: {extra}: holds .hydra/overrides.yaml but no trial number (expected hydra.job.num "
        "in .hydra/hydra.yaml, or a directory named by the number): ValueError: invalid literal "
        "for int() with base 10: 'extra'; move what is not a trial of the sweep out of its "
        "directory"
    )
    (extra / ".hydra" / "overrides.yaml").unlink()
    (sweep / "3" / "metrics.json").write_text('{"val_auc": 0.7')
    assert (
        f"error: {sweep / '3' / 'metrics.json'}: not a readable metrics.json (JSONDecodeError: "
        in (error("--out", str(out)))
    )
    with pytest.raises(ValueError, match=r"3/metrics\.json: not a readable metrics\.json"):
        read_trials(sweep)
    (sweep / "3" / "metrics.json").write_text("[0.7]")
    with pytest.raises(ValueError, match=r"3/metrics\.json: expected a JSON object of metrics, "):
        read_trials(sweep)
    (sweep / "3" / "metrics.json").write_text('{"val_auc": 0.73}')
    (sweep / "3" / ".hydra" / "overrides.yaml").write_text("[optim.lr=1\n")
    with pytest.raises(
        ValueError, match=r"overrides\.yaml: expected Hydra's YAML list of overrides"
    ):
        read_trials(sweep)
    assert not out.exists()


READABLE = "; move it, or the trial's directory, out of the sweep"


@pytest.mark.parametrize(
    ("text", "start", "end"),
    [
        (  # truncated
            "trainer:\n  seed: [1\n",
            "not a readable Hydra config (ParserError: while parsing a flow sequence in ",
            f"but got '<stream end>' in \"<unicode string>\", line 3, column 1: ^){READABLE}",
        ),
        ("- trainer\n", "expected the trial's Hydra config, a YAML mapping, found list", ""),
        (
            "trainer: 5\n",
            "expected the trial's Hydra config with a trainer mapping, found trainer: int",
            "",
        ),
        (
            "\udcff",
            "not a readable Hydra config (UnicodeDecodeError: 'utf-8' codec can't decode byte "
            "0xff in position 0: invalid start byte)",
            READABLE,
        ),
    ],
)
def test_confirm_trials_names_a_damaged_trial_config(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], text: str, start: str, end: str
) -> None:
    """Reproduced: a trial's damaged ``.hydra/config.yaml`` (read for the seed the sweep scored it
    with) failed with a traceback from yaml (or AttributeError: 'list' object has no attribute
    'get'); it is named in one line, as a damaged metrics.json is."""
    sweep = fake_sweep(tmp_path / "sweep")
    config = sweep / "10" / ".hydra" / "config.yaml"
    config.write_bytes(text.encode("utf-8", "surrogateescape"))
    out = tmp_path / "c"
    with pytest.raises(SystemExit) as exit_:
        _confirm_driver().main([str(sweep), "--top", "2", "--seeds", "5,6", "--out", str(out)])
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err
    message = err.strip().splitlines()[-1].partition(" error: ")[2]
    assert message.startswith(f"{config}: {start}") and message.endswith(end), message
    assert not out.exists()
