"""history.jsonl and curves.png (dmt.history), wandb names (dmt.tracking), the sweep's metric."""

from __future__ import annotations

import json
import math

import pytest
import torch
from hydra import compose, initialize_config_module
from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from omegaconf import open_dict

from dmt.history import RunHistory, curves_figure, read_history
from dmt.metrics import StreamingClickMetrics, click_metrics
from dmt.tracking import wandb_name, wandb_values
from dmt.train import (
    CONF_MODULE,
    DivergedTrial,
    _hydra_info,
    check_sweep_metric,
    sweep_value,
    to_config,
)
from tests.conftest import compose_config

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def test_curves_are_drawn_where_a_drawn_record_came_after_the_last_drawing(tmp_path):
    """A figure takes about a second, and every run used to draw three at its end (after the
    validation, after the test, which it does not draw, and at the close): one is drawn now,
    unless a training record came after the validation."""
    png = tmp_path / "curves.png"

    def drawing() -> tuple[int, int]:  # a drawing is a new file renamed into place
        return png.stat().st_ino, png.stat().st_mtime_ns

    h = RunHistory(tmp_path, batch_size=100)
    h.log_train(step=10, loss=0.5, lrs=[0.1], train_time_s=1.0)
    assert not png.exists()
    h.log_eval(step=10, metrics={"auc": 0.7}, split="val")
    drawn = drawing()
    h.log_eval(step=10, metrics={"auc": 0.6}, split="test")
    h.close()
    assert drawing() == drawn
    h = RunHistory(tmp_path, batch_size=100, start_step=10)
    h.log_eval(step=10, metrics={"auc": 0.7}, split="val")
    h.log_train(step=20, loss=0.4, lrs=[0.1], train_time_s=2.0)
    drawn = drawing()
    h.close()
    assert drawing() != drawn  # the step-20 loss is drawn
    drawn = drawing()
    RunHistory(tmp_path, batch_size=100, start_step=20).close()  # this run drew nothing yet
    assert drawing() != drawn


def test_records_throughput_and_curves(tmp_path):
    h = RunHistory(tmp_path, batch_size=100)
    h.log_train(step=10, loss=0.5, lrs=[0.1, 0.003], train_time_s=2.0)
    diverged = h.log_train(step=20, loss=float("nan"), lrs=[0.1, 0.003], train_time_s=2.5)
    evaluated = h.log_eval(step=20, metrics={"auc": 0.7, "ne": float("nan")}, split="val")
    # what goes to wandb keeps the NaN (a reproduced bug: it was left out, as if not logged)
    assert math.isnan(wandb_values(diverged)["train/loss"])
    assert (
        math.isnan(wandb_values(evaluated)["val/ne"]) and wandb_values(evaluated)["val/auc"] == 0.7
    )
    assert (tmp_path / "curves.png").read_bytes()[:8] == PNG_MAGIC  # drawn at the evaluation
    h.close()
    lines = (tmp_path / "history.jsonl").read_text().splitlines()
    records = [json.loads(line) for line in lines]  # strict JSON: NaN is written as null
    assert records == [
        {"step": 10, "samples": 1000, "train/loss": 0.5, "train/lr": [0.1, 0.003],
         "train/samples_per_s": 500.0},
        {"step": 20, "samples": 2000, "train/loss": None, "train/lr": [0.1, 0.003],
         "train/samples_per_s": 2000.0},
        {"step": 20, "samples": 2000, "val/auc": 0.7, "val/ne": None},
    ]  # fmt: skip
    assert "NaN" not in "".join(lines)
    assert not list(tmp_path.glob(".*.tmp"))
    # the loss that became NaN is marked where it did, not drawn as a curve that stops (a
    # diverged run's panels said "no values", as if nothing had been logged)
    panels = curves_figure(records).axes
    assert [t.get_text() for t in panels[0].texts] == ["not finite from 2,000 samples"]
    assert [t.get_text() for t in panels[1].texts] == []  # val/auc: finite
    assert [t.get_text() for t in curves_figure([]).axes[1].texts] == ["no values"]


def test_a_throughput_not_measured_is_left_out_not_drawn_as_not_finite(tmp_path):
    h = RunHistory(tmp_path, batch_size=100)
    h.log_train(step=10, loss=0.5, lrs=[0.1], train_time_s=2.0)
    record = h.log_train(step=20, loss=0.4, lrs=[0.1], train_time_s=2.0)  # no time elapsed
    h.close()
    assert "train/samples_per_s" not in record
    records = read_history(tmp_path / "history.jsonl")
    assert [("train/samples_per_s" in r) for r in records] == [True, False]
    # a reproduced bug: the null it was written as drew 'not finite from 2,000 samples'
    assert [t.get_text() for t in curves_figure(records).axes[2].texts] == []


def test_a_validation_auc_the_split_leaves_undefined_is_not_drawn_as_a_divergence(tmp_path):
    """A reproduced bug: a run without validation rows (data=criteo_sample_holdout) or with
    validation rows of one class drew the mark of a diverged run in curves.png's validation AUC
    panel, a red line and 'not finite from 448 samples', though its model was fine."""
    with pytest.warns(RuntimeWarning, match="predictions are not finite"):
        diverged = click_metrics(torch.tensor([0.2, float("nan")]), torch.tensor([0.0, 1.0]))
    one_class = click_metrics(torch.tensor([0.2, 0.7, 0.4]), torch.zeros(3))
    cases = {
        "undefined: no rows": StreamingClickMetrics().compute(),  # Trainer.evaluate's, no rows
        "undefined: the rows are of one class": one_class,
        "not finite from 448 samples": diverged,  # still marked where the run diverged
    }
    for i, (text, metrics) in enumerate(cases.items()):
        h = RunHistory(tmp_path / str(i), batch_size=64)
        h.log_eval(step=7, metrics=metrics, split="val")
        h.log_eval(step=7, metrics=metrics, split="test")
        h.close()
        records = read_history(h.path)
        assert records[0]["val/auc"] is None  # null in the file, as before
        panel = curves_figure(records).axes[1]
        assert [t.get_text() for t in panel.texts] == [text]
        assert len(panel.lines) == (1 if text.startswith("not finite") else 0)  # the red line


def test_a_resumed_run_keeps_the_records_up_to_its_checkpoint(tmp_path):
    h = RunHistory(tmp_path, batch_size=8)
    for step in (5, 10, 15):
        h.log_train(step=step, loss=1.0, lrs=[0.1], train_time_s=step / 10)
    h.log_eval(step=10, metrics={"auc": 0.6}, split="val")
    h.close()
    with (tmp_path / "history.jsonl").open("a") as f:
        f.write('{"step": 20, "samp')  # cut off by a crash
    resumed = RunHistory(tmp_path, batch_size=8, start_step=10)
    resumed.log_train(step=15, loss=0.9, lrs=[0.1], train_time_s=1.0)
    resumed.close()
    records = read_history(tmp_path / "history.jsonl")
    assert [(r["step"], "val/auc" in r) for r in records] == [
        (5, False), (10, False), (10, True), (15, False)
    ]  # fmt: skip
    assert records[-1]["train/loss"] == 0.9
    assert records[-1]["train/samples_per_s"] == pytest.approx(5 * 8 / 1.0)  # since step 10


def test_wandb_names_are_the_same_during_and_after_a_run():
    assert wandb_name("val_auc") == "val/auc" and wandb_name("test_ne") == "test/ne"
    assert wandb_name("train_samples_per_s") == "train/samples_per_s"
    assert wandb_name("oracle_test_auc") == "test/oracle_auc"
    assert wandb_name("oracle_val_auc") == "val/oracle_auc"
    assert wandb_name("num_steps") == "train/num_steps"
    record = {"step": 4, "samples": 64, "train/loss": 0.5, "train/lr": [0.1, None, 0.003],
              "train/samples_per_s": None}  # fmt: skip
    assert wandb_values(record) == {
        "train/samples": 64, "train/loss": 0.5, "train/lr/0": 0.1, "train/lr/2": 0.003
    }  # fmt: skip


def test_the_sweep_metric_must_exist_and_be_a_number():
    assert sweep_value({"val_auc": 0.7}, "val_auc") == 0.7
    with pytest.raises(ValueError) as missing:
        sweep_value({"val_auc": 0.7, "test_auc": 0.71}, "val_accuracy")
    assert str(missing.value) == (
        "trainer.optimize_metric='val_accuracy' is not a metric of this run; "
        "choose one of ['test_auc', 'val_auc']"
    )
    with pytest.raises(ValueError) as nan:
        sweep_value({"val_auc": math.nan, "test_auc": 0.71}, "val_auc")
    assert str(nan.value) == (
        "trainer.optimize_metric='val_auc' is NaN in this run (a split without rows, e.g. val_* "
        "with data=criteo_sample_holdout, or without clicks); choose a metric this data defines, "
        "e.g. trainer.optimize_metric=test_auc"
    )
    # A reproduced bug: one diverged trial stopped a grid sweep before its trials table, with
    # the message above; its NaN is a failed trial (Optuna fails a NaN objective)
    diverged = {"val_auc": math.nan, "train_loss_last": math.nan}
    assert math.isnan(sweep_value(diverged, "val_auc"))
    # ... but the Optuna sweeper refuses a NaN and stopped the sweep at it: there the trial
    # raises, which it records as a failed trial (the sweep itself: test_train.py)
    with pytest.raises(DivergedTrial) as failed:
        sweep_value(diverged, "val_auc", fail_diverged=True)
    assert str(failed.value) == (
        "trainer.optimize_metric='val_auc' is NaN: this run diverged (train_loss_last=nan); "
        "the sweeper records this trial as failed, and goes on while "
        "hydra.sweeper.max_failure_rate allows (the hparams_search configs set 1.0)"
    )


def test_a_run_whose_last_step_diverged_is_a_failed_trial_not_a_split_without_clicks():
    """A reproduced bug: a trial whose last step made the weights NaN (dmt-train -m
    trainer.max_steps=1 optim.lr=1e30) has a finite train_loss_last, computed before that step;
    its NaN val_auc stopped the sweep with the error of a split without rows or clicks."""
    last_step = {  # its metrics.json: NaN predictions over 1024 rows
        "val_auc": math.nan, "val_logloss": math.nan, "val_num_samples": 1024.0,
        "test_auc": math.nan, "test_logloss": math.nan, "test_num_samples": 1024.0,
        "train_loss_last": 0.6716,
    }  # fmt: skip
    assert math.isnan(sweep_value(last_step, "val_auc"))
    with pytest.raises(DivergedTrial) as failed:
        sweep_value(last_step, "val_auc", fail_diverged=True)
    assert str(failed.value).startswith(
        "trainer.optimize_metric='val_auc' is NaN: this run diverged (train_loss_last=0.6716, "
        "but val_logloss=nan over 1024 rows: its predictions are not finite); the sweeper "
    )
    # a split without clicks has a finite logloss: still the data's error
    no_clicks = {**last_step, "val_logloss": 0.35, "test_auc": 0.7, "test_logloss": 0.5}
    with pytest.raises(ValueError, match=r"^trainer.optimize_metric='val_auc' is NaN in this run"):
        sweep_value(no_clicks, "val_auc")


def test_a_diverged_runs_finite_metric_is_a_failed_trial(caplog):
    """A reproduced bug: a run whose training loss became inf while its saturated model's
    predictions stayed finite (``optim.lr=1e6``: AUC 0.5) returned that AUC to the sweeper as a
    result, Optuna's too; it is a failed trial, as a diverged run's NaN is."""
    saturated = {
        "val_auc": 0.5, "val_logloss": 3.9, "val_num_samples": 1024.0,
        "train_loss_last": math.inf, "train_samples_per_s": 900.0,
    }  # fmt: skip
    with caplog.at_level("WARNING", logger="dmt.train"):
        assert math.isnan(sweep_value(saturated, "val_auc"))
    assert caplog.messages == [
        "trainer.optimize_metric='val_auc' is 0.5, not a result: this run diverged "
        "(train_loss_last=inf)"
    ]
    with pytest.raises(DivergedTrial) as failed:
        sweep_value(saturated, "val_logloss", fail_diverged=True)
    assert str(failed.value).startswith(
        "trainer.optimize_metric='val_logloss' is 3.9, not a result: this run diverged "
        "(train_loss_last=inf); the sweeper records this trial as failed"
    )
    # its throughput is still its throughput: a sweep on it keeps the trial
    assert sweep_value(saturated, "train_samples_per_s", fail_diverged=True) == 900.0
    # an attempt that trained nothing from an earlier dmt's checkpoint knows neither figure:
    # NaN, with a warning of its own; that is no divergence
    unknown = {**saturated, "train_loss_last": math.nan, "train_samples_per_s": math.nan}
    assert sweep_value(unknown, "val_auc", fail_diverged=True) == 0.5


def test_a_sweeps_metric_is_checked_before_its_jobs_train(tmp_path):
    """A reproduced bug: a misspelt trainer.optimize_metric, or val_auc on data without
    validation rows, failed only after every job of the sweep had trained."""
    check_sweep_metric(to_config(compose_config("trainer.optimize_metric=test_ne")))
    check_sweep_metric(to_config(compose_config("trainer.optimize_metric=oracle_val_auc")))
    with pytest.raises(ValueError, match=r"^trainer.optimize_metric='oracle_val_auc' is not a"):
        check_sweep_metric(  # random clicks: no true probabilities to score
            to_config(
                compose_config("data=synthetic_random", "trainer.optimize_metric=oracle_val_auc")
            )
        )
    with pytest.raises(ValueError) as typo:
        check_sweep_metric(to_config(compose_config("trainer.optimize_metric=val_acu")))
    assert str(typo.value).startswith(
        "trainer.optimize_metric='val_acu' is not a metric of this run; choose one of "
        "['num_steps', 'num_train_samples', 'oracle_test_auc', 'oracle_val_auc', "
    )
    raw = tmp_path / "train.tsv"
    raw.write_text("")
    holdout = compose_config("data=criteo_sample_holdout", f"data.criteo.raw_path={raw}")
    with pytest.raises(ValueError, match=r"^trainer.optimize_metric='val_auc': this data has no "):
        check_sweep_metric(to_config(holdout))
    check_sweep_metric(
        to_config(compose_config("data=criteo_sample", f"data.criteo.raw_path={raw}"))
    )
    # days: validation rows come from val_day or half of eval_day, whatever split_fractions says
    days = compose_config("data=criteo_1tb", f"data.criteo.raw_path={tmp_path}",
                   "data.criteo.split_fractions=[0.5,0.0,0.5]")  # fmt: skip
    check_sweep_metric(to_config(days))
    with pytest.raises(ValueError, match=r"this data has no validation rows"):
        check_sweep_metric(to_config(compose_config("data=criteo_1tb_forward_refit")))


def test_hydra_choices_overrides_and_sweep_group_go_into_the_wandb_config(tmp_path):
    if not HydraConfig.initialized():
        assert _hydra_info() == {}  # train() called from Python
    with initialize_config_module(CONF_MODULE, version_base="1.3"):
        cfg = compose("config", overrides=["model=dcn", "optim.lr=0.01"], return_hydra_config=True)
    with open_dict(cfg):
        cfg.hydra.mode = RunMode.MULTIRUN
        cfg.hydra.sweep.dir = str(tmp_path / "sweep")
    HydraConfig.instance().set_config(cfg)
    try:
        info = _hydra_info()["hydra"]
    finally:
        HydraConfig.instance().cfg = None
    assert info["choices"]["model"] == "dcn" and info["choices"]["data"] == "synthetic"
    assert not any(k.startswith("hydra/") for k in info["choices"])
    assert info["overrides"] == ["model=dcn", "optim.lr=0.01"]
    assert info["sweep_dir"] == str(tmp_path / "sweep")


def test_an_evaluation_again_at_a_step_replaces_the_earlier_one(tmp_path):
    """A resumed run that had ended is evaluated again at its last step: the history keeps one
    evaluation per split and step, the latest, in its place (a reproduced bug: two)."""
    first = RunHistory(tmp_path, batch_size=4)
    first.log_train(step=8, loss=0.5, lrs=[0.1], train_time_s=1.0)
    first.log_eval(step=8, metrics={"auc": 0.70}, split="val")
    first.log_eval(step=8, metrics={"auc": 0.69}, split="test")
    first.close()
    again = RunHistory(tmp_path, batch_size=4, start_step=8)
    again.log_eval(step=8, metrics={"auc": 0.71}, split="val")
    again.log_eval(step=8, metrics={"auc": 0.72}, split="test")
    again.close()
    records = read_history(tmp_path / "history.jsonl")
    assert [(r["step"], sorted(r)) for r in records] == [
        (8, ["samples", "step", "train/loss", "train/lr", "train/samples_per_s"]),
        (8, ["samples", "step", "val/auc"]),
        (8, ["samples", "step", "test/auc"]),
    ]
    assert [records[1]["val/auc"], records[2]["test/auc"]] == [0.71, 0.72]
    # in its place: validation alone again keeps the order
    alone = RunHistory(tmp_path, batch_size=4, start_step=8)
    alone.log_eval(step=8, metrics={"auc": 0.73}, split="val")
    alone.close()
    records = read_history(tmp_path / "history.jsonl")
    assert [r.get("val/auc", r.get("test/auc")) for r in records[1:]] == [0.73, 0.72]


def test_an_evaluation_again_replaces_every_earlier_one_of_a_history_with_two(tmp_path):
    """A history written before one evaluation per split and step was kept has two at a step:
    evaluating there again leaves one, the latest."""
    old = [{"step": 8, "samples": 32, "val/auc": auc} for auc in (0.70, 0.71)]
    (tmp_path / "history.jsonl").write_text("".join(json.dumps(r) + "\n" for r in old))
    again = RunHistory(tmp_path, batch_size=4, start_step=8)
    again.log_eval(step=8, metrics={"auc": 0.72}, split="val")
    again.close()
    assert read_history(tmp_path / "history.jsonl") == [{"step": 8, "samples": 32, "val/auc": 0.72}]


def test_a_record_is_in_the_file_before_the_history_is_closed(tmp_path):
    """Each record reaches ``history.jsonl`` as it is logged (a crash or a reader mid-run sees
    it), not when the run closes the file."""
    h = RunHistory(tmp_path, batch_size=4)
    h.log_train(step=4, loss=0.5, lrs=[0.1], train_time_s=1.0)
    assert [r["step"] for r in read_history(tmp_path / "history.jsonl")] == [4]
    h.close()
