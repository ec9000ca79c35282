"""What a run leaves for a person: history.jsonl, curves.png, wandb names; a sweep's metric."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys

import matplotlib.image
import pytest

from dmt.history import read_history
from dmt.optim import LRSchedule
from dmt.runtime import close_runtime, init_runtime
from dmt.tracking import WandbLogger, open_logger, wandb_name
from dmt.train import to_config, train
from dmt.trainer import Trainer
from tests.conftest import REPO, compose_config

RUN = [
    "trainer.progress_bar=false",
    "data.synthetic.num_train=4096",  # 16 steps of 256
    "data.synthetic.num_val=1024",
    "data.synthetic.num_test=1024",
    "data.batch_size=256",
    "trainer.log_every=2",
    "trainer.eval_every=8",
    "optim.schedule.warmup_steps=5",
    "optim.schedule.decay=cosine",
]


def test_a_run_writes_its_history_and_curves(tmp_path, one_thread):
    conf = to_config(compose_config(*RUN, "logger=disabled"))
    metrics = train(conf, tmp_path)
    records = read_history(tmp_path / "history.jsonl")
    assert len(records) == len((tmp_path / "history.jsonl").read_text().splitlines())

    train_records = [r for r in records if "train/loss" in r]
    assert [r["step"] for r in train_records] == list(range(2, 17, 2))  # every trainer.log_every
    settings = {k: v for k, v in conf.optim.schedule.items() if k != "_target_"}
    schedule = LRSchedule(16, **settings)  # optim.schedule's warmup_decay_schedule
    peaks = [conf.optim.sparse_lr, conf.optim.lr]  # the fused embedding group, then the dense one
    for r in train_records:
        assert r["samples"] == r["step"] * 256
        assert math.isfinite(r["train/loss"]) and 0 < r["train/loss"] < 1.5
        assert r["train/samples_per_s"] > 0
        # the LR of each group for this step's update (step - 1 counts from 0)
        expected = [p * schedule(r["step"] - 1) for p in peaks]
        assert r["train/lr"] == pytest.approx(expected, rel=1e-6), r
    assert train_records[0]["train/lr"][1] == pytest.approx(conf.optim.lr * 2 / 5)  # warmup

    val = [r for r in records if "val/auc" in r]
    assert [r["step"] for r in val] == [8, 16]  # eval_every; the final evaluation is step 16's
    assert val[-1]["val/auc"] == metrics["val_auc"] and val[-1]["samples"] == 16 * 256
    (test,) = [r for r in records if "test/auc" in r]
    assert test["step"] == 16 and test["test/auc"] == metrics["test_auc"]
    assert test["test/num_samples"] == 1024

    png = tmp_path / "curves.png"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 20_000
    image = matplotlib.image.imread(png)
    assert image.shape == (400, 1500, 4) and image[..., :3].std() > 0.05  # drawn, not blank
    assert not list(tmp_path.glob(".*.tmp"))


class RecordingLogger:
    """Records the trainer's calls and passes them on to a real (offline) wandb logger."""

    def __init__(self, logger: WandbLogger) -> None:
        self.logger = logger
        self.continued = logger.continued
        self.logged: list[tuple[int, dict[str, float]]] = []
        self.summary: dict[str, float] = {}

    def log(self, values: dict[str, float], step: int) -> None:
        self.logged.append((step, values))
        self.logger.log(values, step)

    def summarize(self, values: dict[str, float]) -> None:
        self.summary.update(values)
        self.logger.summarize(values)


def test_wandb_gets_the_same_names_during_and_after_a_run(tmp_path, one_thread):
    conf = to_config(compose_config(*RUN, "logger.mode=offline", "trainer.max_steps=8"))
    rt = init_runtime("cpu")
    logger = open_logger(conf.logger, {"hydra": {"overrides": ["x=1"]}}, tmp_path, is_main=True)
    assert logger is not None
    recorder = RecordingLogger(logger)
    try:
        metrics = Trainer(conf, rt, tmp_path, recorder).fit().metrics
        summary = dict(logger.run.summary)
        config = dict(logger.run.config)
    finally:
        logger.finish()
        close_runtime()
    during = {k for _, values in recorder.logged for k in values}
    assert {"train/loss", "train/lr/0", "train/lr/1", "train/samples", "train/samples_per_s",
            "val/auc", "val/ne", "test/auc", "test/logloss"} <= during  # fmt: skip
    assert all(name.split("/")[0] in ("train", "val", "test") for name in during)
    assert [s for s, v in recorder.logged if "val/auc" in v] == [8]  # one final evaluation
    # every final value, under a name of the run's (the same as wandb's summary of a real run)
    assert recorder.summary == {wandb_name(k): v for k, v in metrics.items()}
    for key in ("val_auc", "test_auc", "test_ne", "train_samples_per_s"):
        assert recorder.summary[wandb_name(key)] == metrics[key]
        assert wandb_name(key) in during
        assert summary[wandb_name(key)] == metrics[key]  # a real offline wandb run's summary
    assert config["hydra"] == {"overrides": ["x=1"]}


def _cli(*args: str, cwd) -> subprocess.CompletedProcess:
    exe = os.path.join(os.path.dirname(sys.executable), "dmt-train")
    return subprocess.run([exe, *args], cwd=cwd, capture_output=True, text=True, timeout=300)


@pytest.mark.slow  # a CLI multirun (about 20 s on 2 shared cores)
def test_a_sweep_on_data_without_validation_rows_stops_naming_its_metric(tmp_path):
    """``val_auc`` with ``data=criteo_sample_holdout`` (no validation rows) is NaN: a sweeper
    would rank the points by nothing."""
    raw = tmp_path / "train.tsv"
    rows = ["\t".join([str(int(i % 3 == 0)), *[str(i % 7)] * 13, *[f"{i % 5:08x}"] * 26])
            for i in range(800)]  # fmt: skip
    raw.write_text("\n".join(rows) + "\n")
    data = ["data=criteo_sample_holdout", f"data.criteo.raw_path={raw}",
            f"data.criteo.preprocessed_dir={tmp_path / 'prep'}", "data.criteo.num_workers=1",
            "data.batch_size=128", "logger=disabled", "trainer=smoke"]  # fmt: skip
    sweep = _cli("-m", *data, "optim.lr=1e-3,2e-3", f"hydra.sweep.dir={tmp_path}/sweep", cwd=REPO)
    assert sweep.returncode != 0
    assert (
        "ValueError: trainer.optimize_metric='val_auc': this data has no validation rows "
        "(data.criteo.split_fractions[1] = 0 or data.criteo.val_split=false, e.g. "
        "data=criteo_sample_holdout), so it would be NaN in every job; choose a metric this "
        "data defines, e.g. trainer.optimize_metric=test_auc"
    ) in sweep.stderr, sweep.stderr[-3000:]
    # before the first job trained (it used to fail after every job of the batch had)
    assert not (tmp_path / "sweep" / "0" / "metrics.json").exists()
    assert not (tmp_path / "prep").exists()  # nor preprocessed the data
    # the metric this data defines: the sweep runs and reads it
    sweep = _cli("-m", *data, "optim.lr=1e-3,2e-3", "trainer.optimize_metric=test_auc",
                 f"hydra.sweep.dir={tmp_path}/sweep2", cwd=REPO)  # fmt: skip
    assert sweep.returncode == 0, sweep.stderr[-3000:]
    first = json.loads((tmp_path / "sweep2" / "0" / "metrics.json").read_text())
    assert math.isnan(first["val_auc"]) and first["test_auc"] > 0


@pytest.mark.slow  # 19 s: CI time (test_train.py's CLI multirun sweep is slow too)
def test_a_multirun_groups_its_points_and_records_hydra_choices_in_wandb(tmp_path):
    """The offline run file (wandb's own record format) holds the group and the Hydra config."""
    tiny = ["trainer=smoke", "logger.mode=offline", "data.synthetic.num_train=1024",
            "data.synthetic.num_val=256", "data.synthetic.num_test=256", "data.batch_size=256"]  # fmt: skip
    sweep_dir = tmp_path / "sweep"
    res = _cli("-m", *tiny, "model=dlrm,dcn", f"hydra.sweep.dir={sweep_dir}", cwd=tmp_path)
    assert res.returncode == 0, res.stderr[-3000:]
    for num, model in enumerate(("dlrm", "dcn")):
        (run_file,) = (sweep_dir / str(num) / "wandb").glob("offline-run-*/run-*.wandb")
        data = run_file.read_bytes()
        group = str(sweep_dir).encode()
        assert len(group) < 128  # a one-byte length prefix in the protobuf record
        assert (
            bytes([len(group)]) + group in data
        )  # a field equal to the sweep directory: the group
        assert f"model={model}".encode() in data  # hydra.overrides
        assert b"model/interaction" in data  # hydra.choices
        assert (sweep_dir / str(num) / "history.jsonl").exists()


def test_a_run_resumed_in_its_directory_goes_on_with_its_history(tmp_path, one_thread):
    run = [*RUN, "logger=disabled", "trainer.eval_every=0", "trainer.resume_from=auto"]
    train(compose_config(*run, "trainer.max_steps=4", "trainer.checkpoint=true"), tmp_path)
    with (tmp_path / "history.jsonl").open("a") as f:  # as if it had died after its checkpoint
        f.write(json.dumps({"step": 6, "samples": 1536, "train/loss": 9.0}) + "\n")
    longer = ["trainer.max_steps=8", "trainer.resume_allow_config_change=true"]
    metrics = train(compose_config(*run, *longer), tmp_path)
    records = read_history(tmp_path / "history.jsonl")
    steps = [r for r in records if "train/loss" in r]
    assert [r["step"] for r in steps] == [2, 4, 6, 8]  # step 6 of the dead run was dropped
    assert all(r["train/loss"] < 9 and r["train/samples_per_s"] > 0 for r in steps)
    # the first run's final evaluation at its last step, then this one's
    assert [r["step"] for r in records if "val/auc" in r] == [4, 8]
    assert records[-1]["test/auc"] == metrics["test_auc"] and records[-1]["step"] == 8
