"""Resuming: the config must fit the checkpoint, ``resume_from=auto``, damaged checkpoints."""

from __future__ import annotations

import json
import logging
import math
import shutil
import subprocess
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from torch.distributed._shard.sharded_tensor import ShardedTensor
from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

from dmt import checkpoint
from dmt.history import read_history
from dmt.models import TowerModule
from dmt.run_dir import check_resume_config
from dmt.runtime import close_runtime, init_runtime
from dmt.train import to_config, train
from dmt.trainer import LAST_STEPS, Trainer
from tests.conftest import compose_config, torchrun
from tests.unit.test_criteo_preprocess import make_rows, write

TINY = [
    "logger=disabled",
    "trainer.progress_bar=false",
    "data.synthetic.num_train=2048",
    "data.synthetic.num_val=256",
    "data.synthetic.num_test=256",
    "data.batch_size=256",
    "trainer.eval_max_batches=1",
    "model.embedding_dim=8",
    "model.bottom_mlp=[16,8]",
    "model.top_mlp=[16,1]",
]


# plain SGD on the dense part (it takes no eps): the optimizer is its config's _target_
SGD = ("optim.dense._target_=torch.optim.SGD", "~optim.dense.eps")


def _train(out: Path, *overrides: str) -> dict[str, float]:
    return train(compose_config(*TINY, *overrides), out)


def test_resume_with_another_model_stops_with_the_differing_keys(tmp_path: Path) -> None:
    """The issue's reproduction: it used to print "resumed at step 4" and restart the dense
    layers from random weights."""
    first = tmp_path / "first"
    _train(first, "trainer.max_steps=8", "trainer.checkpoint_every=4", *SGD)
    step_4 = first / "checkpoints" / "step_4"
    with pytest.raises(ValueError) as e:
        _train(
            tmp_path / "second",
            "trainer.max_steps=8",
            *SGD,
            f"trainer.resume_from={step_4}",
            "model.top_mlp=[128,64,1]",
            "model.bottom_mlp=[32,8]",
        )
    msg = str(e.value)
    assert msg.startswith(f"cannot resume from {step_4}: this run's config differs")
    assert (
        "model.bottom_mlp: [16, 8] -> [32, 8]" in msg
        and "model.top_mlp: [16, 1] -> [128, 64, 1]" in msg
    )
    assert "resume_allow_config_change" not in msg  # the model may not change at all

    # optimizer keys change only when asked to
    with pytest.raises(
        ValueError,
        match=r"optim.dense._target_: 'torch.optim.SGD' -> 'torch.optim.Adam'.*"
        r"resume_allow_config_change=true",
    ):
        _train(tmp_path / "third", "trainer.max_steps=8", f"trainer.resume_from={step_4}")
    # the run's length only when the schedule spans the run: the checkpoint's has no decay
    with pytest.raises(ValueError, match=r"'torch.optim.SGD' -> 'torch.optim.Adam'.*\)$") as e:
        _train(tmp_path / "third", "trainer.max_steps=12", f"trainer.resume_from={step_4}")
    assert "max_steps" not in str(e.value).split(" (")[0]
    m = _train(
        tmp_path / "fourth",
        "trainer.epochs=2",
        "trainer.max_steps=12",
        "trainer.resume_allow_config_change=true",
        f"trainer.resume_from={step_4}",
    )
    assert m["num_steps"] == 12


def test_going_back_to_an_earlier_checkpoint_of_the_run_is_refused_at_start(
    tmp_path: Path,
) -> None:
    """A reproduced bug: resuming a run from its step_4 while its step_8 exists trained steps
    5-8 and then failed to write step_8 ("dmt never overwrites a complete checkpoint"), the
    retrained steps lost. It is refused at start; the same resume into a new run directory
    trains on and equals the first run."""
    run = tmp_path / "run"
    args = ("trainer.max_steps=8", "trainer.checkpoint_every=4", *SGD)
    first = _train(run, *args)
    step_4 = run / "checkpoints" / "step_4"
    with pytest.raises(ValueError) as e:
        _train(run, *args, f"trainer.resume_from={step_4}")
    assert str(e.value) == (
        f"trainer.resume_from={str(step_4)!r} goes back in this run: its checkpoint directory "
        "holds the newer step_8, which training on would reach and may not overwrite; resume "
        "into a new run (another hydra.run.dir, and another trainer.checkpoint_dir if yours is "
        f"absolute) or move them out of {str(run / 'checkpoints')!r}"
    )
    again = _train(tmp_path / "branch", *args, f"trainer.resume_from={step_4}")
    assert again["test_auc"] == pytest.approx(first["test_auc"], abs=1e-6)
    assert again["num_steps"] == 8


def test_a_resume_on_training_data_that_lacks_its_position_is_refused(tmp_path: Path) -> None:
    """A reproduced bug: a resume may move the data (``data.criteo.raw_path`` and
    ``preprocessed_dir`` are free), and one pointed at other rows went on silently from a
    position they do not have: step 12 (batch 2 of epoch 1 of 10 batches) on 15 batches per
    epoch started epoch 1 at batch -3, and trained 3 steps on empty batches (NaN losses). It is
    refused, naming the checkpoint and both positions; the same rows moved resume, into a new
    preprocessed directory or from the checkpoint's (a reproduced bug: that one was refused as
    made from other sources)."""
    crit = ["data=criteo_sample", "data.criteo.num_workers=1", "data.criteo.prefetch_batches=0"]
    crit += ["data.criteo.categorical_mode=hash", "data.criteo.hash_sizes=[64]"]  # same tables
    crit += ["data.batch_size=64", "trainer.epochs=2"]

    def data(rows: int, seed: int, name: str) -> list[str]:  # 85% training rows
        raw = write(tmp_path / f"{name}.tsv", make_rows(rows, seed=seed))
        return [f"data.criteo.raw_path={raw}", f"data.criteo.preprocessed_dir={tmp_path / name}"]

    first = data(400, 1, "first")  # 340 training rows: 5 batches per epoch
    _train(tmp_path / "run", *crit, *first, "trainer.max_steps=6", "trainer.checkpoint_every=3")
    ckpt = tmp_path / "run" / "checkpoints"
    cases = [  # step, its position, rows of the other data, its batches per epoch, the position
        (6, "batch 1 of epoch 1", 600, 7, "batch 6 of epoch 0"),
        (3, "batch 3 of epoch 0", 200, 2, "batch 1 of epoch 1"),
    ]
    for step, saved, rows, per_epoch, here in cases:
        step_dir = ckpt / f"step_{step}"
        other = data(rows, 2, f"other_{rows}")
        with pytest.raises(ValueError) as e:
            _train(tmp_path / f"to_{rows}", *crit, *other, f"trainer.resume_from={step_dir}")
        assert str(e.value) == (
            f"cannot resume from {step_dir}: it is at step {step}, {saved}, and this run's "
            f"training data ({per_epoch} global batches of data.batch_size=64 per epoch) at "
            f"{here}: it is not the checkpoint's data (a resume may move the data, "
            "data.criteo.raw_path and data.criteo.preprocessed_dir, not change its rows)"
        )
    (tmp_path / "first.tsv").rename(tmp_path / "moved.tsv")
    moved = [f"data.criteo.raw_path={tmp_path / 'moved.tsv'}"]
    moved += [f"data.criteo.preprocessed_dir={tmp_path / 'moved'}"]
    resumed = [*crit, *moved, "trainer.max_steps=6", f"trainer.resume_from={ckpt}"]
    assert _train(tmp_path / "moved_run", *resumed)["num_steps"] == 6
    kept = [*resumed, f"data.criteo.preprocessed_dir={tmp_path / 'first'}"]
    assert _train(tmp_path / "kept_run", *kept)["num_steps"] == 6


def test_a_resume_on_other_training_rows_is_refused(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A reproduced bug: a resume on another file with as many rows (its position valid) trained
    on its rows without a word. The checkpoint's meta.json records what identifies its training
    rows (no paths): a resume on other rows is refused, naming what differs; the same rows copied
    elsewhere resume; other rows (here the same rows gzipped) only with
    trainer.resume_allow_config_change=true, with a warning; a checkpoint of an older dmt
    without the record resumes with a warning."""
    crit = ["data=criteo_sample", "data.criteo.num_workers=1", "data.criteo.prefetch_batches=0"]
    crit += ["data.criteo.categorical_mode=hash", "data.criteo.hash_sizes=[64]"]
    crit += ["data.batch_size=64", "trainer.epochs=2", "trainer.max_steps=6"]

    def data(raw: Path) -> list[str]:
        return [
            f"data.criteo.raw_path={raw}",
            f"data.criteo.preprocessed_dir={tmp_path / raw.name}-pp",
        ]

    first = write(tmp_path / "first.tsv", make_rows(400, seed=1))  # 5 batches per epoch
    _train(tmp_path / "run", *crit, *data(first), "trainer.checkpoint_every=3")
    step_3 = tmp_path / "run" / "checkpoints" / "step_3"
    other = write(tmp_path / "other.tsv", make_rows(400, seed=2))  # as many rows
    with pytest.raises(ValueError) as e:
        _train(tmp_path / "to_other", *crit, *data(other), f"trainer.resume_from={step_3}")
    pp = str(tmp_path / "other.tsv-pp")
    size = f"train_lines.0.size: {first.stat().st_size} -> {other.stat().st_size}"
    assert str(e.value).startswith(
        f"cannot resume from {step_3}: it trained on other rows than this run's "
        f"data.criteo.preprocessed_dir={pp!r} holds ("
    )
    assert size in str(e.value) and "train_lines.0.fingerprint: '" in str(e.value)
    assert str(e.value).endswith(
        "): a resume may move the data (data.criteo.raw_path and data.criteo.preprocessed_dir), "
        "not change its rows; point them at the checkpoint's data, or set "
        "trainer.resume_allow_config_change=true to train on with these rows"
    )
    assert not (tmp_path / "to_other" / "metrics.json").exists()
    # refused before Hydra writes the run's .hydra/ record too (dmt.run_dir), where the
    # preprocessed directory holds the rows already (a reproduced bug: only the trainer refused
    # them, after Hydra had rewritten a finished run's record to name the other data)
    with pytest.raises(ValueError) as before_hydra:
        check_resume_config(
            compose_config(*TINY, *crit, *data(other), f"trainer.resume_from={step_3}"),
            tmp_path / "to_other",
            str(step_3),
            "checkpoints",
        )
    assert str(before_hydra.value) == str(e.value)
    # the same rows copied elsewhere (another path, another modification time) resume
    copy = tmp_path / "copy.tsv"
    copy.write_bytes(first.read_bytes())
    resumed = [*crit, f"trainer.resume_from={step_3}"]
    assert _train(tmp_path / "copied", *resumed, *data(copy))["num_steps"] == 6
    check_resume_config(  # its rows pass the check before Hydra writes as well
        compose_config(*TINY, *resumed, *data(copy)),
        tmp_path / "copied",
        str(step_3),
        "checkpoints",
    )
    # gzipped, the rows are the same but not the file: trained on only when asked, with a word
    gz = write(tmp_path / "first.tsv.gz", make_rows(400, seed=1))
    with pytest.raises(ValueError, match=r"train_lines\.0\.gzip: False -> True"):
        _train(tmp_path / "gz", *resumed, *data(gz))
    caplog.clear()
    allowed = [*resumed, *data(gz), "trainer.resume_allow_config_change=true"]
    assert _train(tmp_path / "gz", *allowed)["num_steps"] == 6
    assert (
        f"checkpoint {step_3} trained on other rows than this run's data.criteo.preprocessed_dir="
        f"{str(tmp_path / 'first.tsv.gz-pp')!r} holds (train_lines.0.fingerprint: "
    ) in caplog.text
    assert "resume_allow_config_change=true: training on with this run's rows" in caplog.text
    # a checkpoint saved before the record: resumed (its position checked), with a warning
    meta = json.loads((step_3 / "meta.json").read_text())
    del meta["train_data"]
    (step_3 / "meta.json").write_text(json.dumps(meta))
    caplog.clear()
    assert _train(tmp_path / "older", *resumed, *data(other))["num_steps"] == 6
    assert (
        f"checkpoint {step_3} was saved by a dmt that did not record its training data: "
        f"data.criteo.preprocessed_dir={pp!r} is not checked against it"
    ) in caplog.text


def test_a_new_dense_optimizer_keeps_the_tables_fused_optimizer_step(tmp_path: Path) -> None:
    """A reproduced bug: resuming with another dense optimizer (its state starts fresh) also
    restarted FBGEMM's step count of the tables, whose state was loaded whole; Adam's bias
    correction on the tables would then have used a step count of 0."""
    run = tmp_path / "run"
    _train(run, "trainer.max_steps=8", "trainer.checkpoint_every=4", *SGD)
    changed = tmp_path / "changed"
    _train(
        changed,
        "trainer.max_steps=8",
        "trainer.checkpoint_every=4",
        "trainer.resume_allow_config_change=true",
        f"trainer.resume_from={run / 'checkpoints' / 'step_4'}",
    )
    meta = [
        json.loads((r / "checkpoints" / "step_8" / "meta.json").read_text()) for r in (run, changed)
    ]
    assert meta[0]["fused_optimizer_step"] > 4
    assert meta[1]["fused_optimizer_step"] == meta[0]["fused_optimizer_step"]
    # the new dense Adam starts as a new one does: 4 steps after the resume it is at step 4
    # (it was at 5: the state was made by a dummy step before loading)
    saved = tmp_path / "changed.pt"
    dcp_to_torch_save(changed / "checkpoints" / "step_8", saved)
    optim = torch.load(saved, weights_only=False)["optim"]
    steps = {k: float(v["step"]) for k, v in optim.items() if "exp_avg" in v}
    assert len(steps) >= 4 and set(steps.values()) == {4.0}, steps
    # and on to SGD with momentum (a state without a step; this resume raised KeyError)
    momentum = _train(
        tmp_path / "momentum",
        "trainer.epochs=2",
        "trainer.max_steps=12",
        "trainer.resume_allow_config_change=true",
        *SGD,
        "+optim.dense.momentum=0.9",
        f"trainer.resume_from={changed / 'checkpoints' / 'step_8'}",
    )
    assert momentum["num_steps"] == 12


def test_another_sparse_optimizer_starts_its_state_fresh_when_allowed(tmp_path: Path) -> None:
    """A reproduced bug: row-wise and exact Adagrad name their table state alike (momentum1,
    (rows,) and (rows, cols)), so switching between them was taken for the same state and
    failed in DCP's load (a size mismatch) despite trainer.resume_allow_config_change=true."""
    run = tmp_path / "run"
    _train(run, "trainer.max_steps=4", "trainer.checkpoint=true", *SGD)
    step_4 = run / "checkpoints" / "step_4"
    exact = ("optim.sparse._target_=torch.optim.Adagrad", "trainer.max_steps=8")
    with pytest.raises(ValueError, match=r"optim.sparse._target_: .*resume_allow_config_change"):
        _train(tmp_path / "refused", *exact, *SGD, f"trainer.resume_from={step_4}")
    m = _train(
        tmp_path / "exact",
        "optim.sparse._target_=torch.optim.Adagrad",
        "trainer.max_steps=5",
        "trainer.checkpoint=true",
        *SGD,
        "trainer.resume_allow_config_change=true",
        f"trainer.resume_from={step_4}",
    )
    assert m["num_steps"] == 5
    # fresh: Adagrad's first step from an empty accumulator moves every element it touches by
    # lr g / (|g| + eps), i.e. by the learning rate (0.1) but where |g| is near eps; an
    # accumulator carried over from the row-wise one's 4 steps would make the steps smaller
    before = checkpoint.load_model_state(step_4, ema=False)
    after = checkpoint.load_model_state(tmp_path / "exact" / "checkpoints" / "step_5", ema=False)
    tables = [k for k in before if ".embedding_bags." in k]
    assert tables
    for key in tables:
        moved = (after[key] - before[key]).abs()
        moved = moved[moved > 0]
        assert moved.numel() > 0 and float(moved.max()) <= 0.1 + 1e-6, key
        assert float(moved.median()) == pytest.approx(0.1, abs=1e-4), key


def test_an_unreadable_saved_config_is_a_clear_error(tmp_path: Path) -> None:
    """config.yaml is the one checkpoint file a user may edit: a broken edit is an error that
    names the file (every rank raises it: rank 0's ValueError is broadcast), not a parser's
    traceback on rank 0 alone."""
    run = tmp_path / "run"
    _train(run, "trainer.max_steps=2", "trainer.checkpoint=true")
    step = run / "checkpoints" / "step_2"
    (step / "config.yaml").write_text("model: [unclosed\n")
    with pytest.raises(ValueError, match=rf"^cannot read checkpoint {step}'s config.yaml: "):
        checkpoint.check_config(step, "model: {}\n", allow_change=False)
    (step / "config.yaml").write_text("- a list\n")
    with pytest.raises(ValueError) as e:
        checkpoint.check_config(step, "model: {}\n", allow_change=False)
    assert str(e.value) == f"checkpoint {step}'s config.yaml holds a list, not a config"


def test_resuming_a_finished_run_keeps_its_metrics_and_a_resume_counts_all_samples(
    tmp_path: Path,
) -> None:
    """A reproduced bug: resuming a run that had ended rewrote its metrics.json with this
    attempt's nothing (0 samples/s, NaN loss) and appended its evaluations to history.jsonl
    again; and a resumed run counted only its last attempt's samples. Such a resume evaluates
    again (a resume may change what the evaluation reads) and keeps the run's training figures
    and one evaluation per split and step."""
    run = tmp_path / "run"
    # 128-row evaluation batches: trainer.eval_max_batches (1 in TINY) cuts the 256 test rows
    args = ("trainer.max_steps=8", "trainer.checkpoint_every=4", "data.eval_batch_size=128", *SGD)
    first = _train(run, *args)
    assert first["num_train_samples"] == 8 * 256 and first["train_samples_per_s"] > 0
    assert first["test_num_samples"] == 128
    metrics, history = ((run / f).read_text() for f in ("metrics.json", "history.jsonl"))
    again = _train(run, *args, "trainer.resume_from=auto")
    assert again == json.loads(metrics)
    assert (run / "metrics.json").read_text() == metrics
    assert (run / "history.jsonl").read_text() == history
    # evaluated again with a setting a resume may change: its figures, the run's training ones
    again = _train(run, *args, "trainer.resume_from=auto", "trainer.eval_max_batches=2")
    assert again["test_num_samples"] == 256 and again["test_auc"] != first["test_auc"]
    training = ("num_steps", "num_train_samples", "train_samples_per_s", "train_loss_last")
    assert {k: again[k] for k in training} == {k: first[k] for k in training}
    assert json.loads((run / "metrics.json").read_text()) == again
    records = [json.loads(line) for line in (run / "history.jsonl").read_text().splitlines()]
    old = [json.loads(line) for line in history.splitlines()]
    assert len(records) == len(old) and records[:-2] == old[:-2]  # the evaluations replaced
    assert records[-1]["test/num_samples"] == 256
    # from step 4 in a run of its own: the run's 8 steps of samples, its metrics the first's
    branch = _train(tmp_path / "branch", *args, f"trainer.resume_from={run}/checkpoints/step_4")
    assert branch["num_train_samples"] == 8 * 256
    assert branch["test_auc"] == pytest.approx(first["test_auc"], abs=1e-6)
    # the finished checkpoint in a run of its own: nothing trained there; the figures of the
    # attempt that trained to it, which its checkpoint records (once NaN: no metrics.json there)
    ended = _train(tmp_path / "ended", *args, f"trainer.resume_from={run}/checkpoints/step_8")
    assert ended["num_train_samples"] == 8 * 256 and ended["num_steps"] == 8
    assert {k: ended[k] for k in training} == {k: first[k] for k in training}


class _Killed(Exception):
    """Stands in for a kill of the process (a preemption, a time limit)."""


def test_a_run_killed_in_its_final_evaluation_keeps_its_training_figures(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Reproduced bug: a run killed during its final evaluation, after its last checkpoint, and
    resumed (trainer.resume_from=auto) trains nothing and wrote train_loss_last and
    train_samples_per_s NaN: they were read only from a metrics.json of that step, which the
    killed attempt never wrote. The checkpoint records them: the mean of the killed attempt's
    last losses (here every step's, all logged) and its throughput, as its metrics.json would
    have held them. A checkpoint without the record (an earlier dmt's) gives NaN, and says why."""
    run = tmp_path / "run"
    args = ("trainer.max_steps=8", "trainer.checkpoint=true", "trainer.log_every=1", *SGD)
    evaluate = Trainer.evaluate

    def killed_at_test(trainer: Trainer, source: Any) -> dict[str, float]:
        if source is trainer.data.test:
            raise _Killed
        return evaluate(trainer, source)

    monkeypatch.setattr(Trainer, "evaluate", killed_at_test)
    with pytest.raises(_Killed):
        _train(run, *args)
    monkeypatch.setattr(Trainer, "evaluate", evaluate)
    assert not (run / "metrics.json").exists()
    losses = [r["train/loss"] for r in read_history(run / "history.jsonl") if "train/loss" in r]
    assert len(losses) == 8
    resumed = _train(run, *args, "trainer.resume_from=auto")
    assert resumed["num_steps"] == 8
    assert resumed["train_loss_last"] == float(np.mean(losses[-LAST_STEPS:]))
    step_8 = run / "checkpoints" / "step_8"
    recorded = checkpoint.read_meta(step_8)[checkpoint.TRAINING_KEY]
    assert resumed["train_samples_per_s"] == recorded["train_samples_per_s"] > 0
    assert json.loads((run / "metrics.json").read_text())["train_loss_last"] == float(
        np.mean(losses)
    )
    # an earlier dmt's checkpoint, and no metrics.json of its step: NaN, and why
    meta = checkpoint.read_meta(step_8)
    del meta[checkpoint.TRAINING_KEY]
    (step_8 / checkpoint.META_FILE).write_text(json.dumps(meta))
    (run / "metrics.json").unlink()
    with caplog.at_level(logging.WARNING, logger="dmt.trainer"):
        older = _train(run, *args, "trainer.resume_from=auto")
    assert math.isnan(older["train_loss_last"]) and math.isnan(older["train_samples_per_s"])
    assert (
        "train_loss_last and train_samples_per_s are NaN: this attempt trained nothing "
        f"(checkpoint {step_8} is at the run's last step 8), and neither that checkpoint (saved "
        f"by an earlier dmt) nor a metrics.json of step 8 in {run} records the figures of the "
        "attempt that trained to it"
    ) in caplog.messages


def test_resume_auto_without_a_checkpoint_does_not_replace_a_finished_run(tmp_path: Path) -> None:
    run = tmp_path / "run"
    _train(run, "trainer.max_steps=2")
    before = (run / "metrics.json").read_text()
    with pytest.raises(
        ValueError, match=r"already holds another run's outputs \(metrics.json, history.jsonl\)"
    ):
        _train(run, "trainer.max_steps=2", "trainer.resume_from=auto", "trainer.seed=1")
    assert (run / "metrics.json").read_text() == before


def test_config_differences_free_and_strict_keys() -> None:
    saved = {
        "model": {"name": "dlrm"},
        "trainer": {"epochs": 1, "seed": 0, "log_every": 50},
        "optim": {"lr": 0.1},
        "logger": {"mode": "offline"},
    }
    same_job = {
        "model": {"name": "dlrm"},
        # the loop: pipelined and plain compute the same (tests/distributed/test_pipeline.py)
        "trainer": {
            "epochs": 1,
            "seed": 0,
            "log_every": 10,
            "pipeline": False,
            "pipeline_world_of_one": True,
            "reuse_host_memory": False,  # the allocator's thresholds; absent from older configs
        },
        "optim": {"lr": 0.1},
        "logger": {"mode": "online"},
        "sptt": {"comm_precision": "bf16"},  # absent from older checkpoints' configs
    }
    assert checkpoint.config_differences(saved, same_job, allow_change=False) == []
    # how evaluation and loading run, not what they compute: a job requeued onto smaller nodes
    # may change them (they were refused even with resume_allow_config_change)
    reader = {"data": {"eval_batch_size": 8192, "criteo": {"in_memory": True, "num_workers": 0}}}
    smaller = {"data": {"eval_batch_size": 512, "criteo": {"in_memory": False, "num_workers": 4}}}
    assert checkpoint.config_differences(reader, smaller, allow_change=False) == []
    other = {
        "model": {"name": "dcn"},
        "trainer": {"epochs": 3, "seed": 1, "log_every": 50},
        "optim": {"lr": 0.2},
    }
    # no decay: the run may get longer
    assert checkpoint.config_differences(saved, other, allow_change=False) == [
        "model.name: 'dlrm' -> 'dcn'",
        "optim.lr: 0.1 -> 0.2",
        "trainer.seed: 0 -> 1",
    ]
    # a decay until the end of training spans the run: its length is a schedule key
    saved["optim"] |= {"schedule": {"decay": "linear", "decay_steps": 0}}
    other["optim"] |= {"schedule": {"decay": "linear", "decay_steps": 0}}
    assert checkpoint.config_differences(saved, other, allow_change=False) == [
        "model.name: 'dlrm' -> 'dcn'",
        "optim.lr: 0.1 -> 0.2",
        "trainer.epochs: 1 -> 3",
        "trainer.seed: 0 -> 1",
    ]
    assert checkpoint.config_differences(saved, other, allow_change=True) == [
        "model.name: 'dlrm' -> 'dcn'",
        "trainer.seed: 0 -> 1",
    ]
    # another schedule factory is given the run's total_steps: it may span the run (a
    # reproduced bug: the length was free for it, and a resume replayed another curve)
    custom = {"schedule": {"_target_": "my.schedules.one_cycle"}}
    saved["optim"], other["optim"] = {"lr": 0.1, **custom}, {"lr": 0.1, **custom}
    assert checkpoint.config_differences(saved, other, allow_change=False) == [
        "model.name: 'dlrm' -> 'dcn'",
        "trainer.epochs: 1 -> 3",
        "trainer.seed: 0 -> 1",
    ]


def test_keys_added_since_a_checkpoint_compare_with_their_defaults() -> None:
    """A checkpoint saved before a setting existed (data.criteo.val_split, val_day, missing_id)
    had the behaviour of its default: a run that keeps the default resumes it, one that
    changes it does not; a key without a schema default stays ``<absent>``."""
    saved = {"data": {"criteo": {"train_days": [0, 1], "eval_day": 2}}}
    current = {
        "data": {
            "criteo": {
                "train_days": [0, 1],
                "eval_day": 2,
                "val_split": True,
                "val_day": None,
                "missing_id": "shared",
            }
        }
    }
    assert checkpoint.config_differences(saved, current, allow_change=False) == []
    current["data"]["criteo"] |= {"val_split": False, "missing_id": "distinct"}
    current["model"] = {"name": "dcn"}
    assert checkpoint.config_differences(saved, current, allow_change=True) == [
        "data.criteo.missing_id: 'shared' -> 'distinct'",
        "data.criteo.val_split: True -> False",
        "model.name: '<absent>' -> 'dcn'",
    ]


def test_component_keys_added_since_a_checkpoint_compare_with_their_schema_defaults() -> None:
    """A setting added to a component (``model.tower.bias``, ``model.tower.init`` of DLRM tower
    modules, chosen by ``_target_``) compares with the default of the saved ``_target_``'s schema:
    a DMT-DLRM checkpoint from before it resumes with the default (a reproduced bug: it was
    ``'<absent>'``, refused even with ``resume_allow_config_change``), not with another value."""
    dlrm = "dmt.models.tower_modules.DLRMTowerModule"
    saved = {"model": {"tower": {"_target_": dlrm, "dim": 16, "c": 1, "p": 0}}}
    current = {
        "model": {"tower": {"_target_": dlrm, "dim": 16, "c": 1, "p": 0, "bias": True}},
        "optim": {"tower_lr_scale": 1.0},
    }
    current["model"]["tower"]["init"] = "default"
    assert checkpoint.config_differences(saved, current, allow_change=False) == []
    current["model"]["tower"] |= {"bias": False, "init": "isometric"}
    assert checkpoint.config_differences(saved, current, allow_change=True) == [
        "model.tower.bias: True -> False",
        "model.tower.init: 'default' -> 'isometric'",
    ]
    # a field the saved target's schema does not have stays absent
    saved["model"]["tower"]["_target_"] = "dmt.models.tower_modules.DCNTowerModule"
    assert "model.tower.init: '<absent>' -> 'isometric'" in checkpoint.config_differences(
        saved, current, allow_change=True
    )


def test_recorded_partition_towers_are_compared_where_both_configs_hold_them() -> None:
    """A tp run's checkpoint records its file's towers; a resume whose file holds others is
    refused, naming the file and the change. A checkpoint of an older dmt holds none, and a
    config whose file was not read yet (Hydra's record) none either: nothing to compare."""

    def config(towers: list[list[str]] | None) -> dict:
        partition = {"kind": "tp", "path": "tp/partition.yaml", "recorded_towers": towers}
        return {"model": {"partition": partition}}

    trained = [["cat_0", "cat_1"], ["cat_2"]]
    assert checkpoint.config_differences(config(trained), config(trained), allow_change=False) == []
    assert checkpoint.config_differences(
        config(trained), config([["cat_1", "cat_0"], ["cat_2"]]), allow_change=True
    ) == [
        "model.partition.recorded_towers: partition file 'tp/partition.yaml' holds other towers "
        "than the checkpoint trained (tower 0: [cat_0, cat_1] -> [cat_1, cat_0] (the same "
        "features in another order))"
    ]
    older = config(None)
    del older["model"]["partition"]["recorded_towers"]
    for saved, current in [(older, config(trained)), (config(trained), config(None))]:
        assert checkpoint.config_differences(saved, current, allow_change=False) == []


def test_resume_auto_takes_the_newest_complete_checkpoint_and_skips_a_damaged_one(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    run = tmp_path / "run"
    # nothing to resume: starts fresh
    ref = _train(
        run, "trainer.max_steps=6", "trainer.checkpoint_every=2", "trainer.resume_from=auto"
    )
    assert ref["num_steps"] == 6
    ckpts = run / "checkpoints"
    assert [p.name for _, p in checkpoint.step_dirs(ckpts)] == ["step_6", "step_4", "step_2"]
    final = checkpoint.load_model_state(ckpts / "step_6")
    # DCP's index is a dotfile that a copy with `cp step_N/*` leaves behind: listed and checked
    assert ".metadata" in json.loads((ckpts / "step_4" / checkpoint.META_FILE).read_text())["files"]
    (ckpts / "step_2" / ".metadata").unlink()
    assert checkpoint.damage(ckpts / "step_2") == (
        f"{ckpts / 'step_2' / '.metadata'} is missing; a copy that skips dotfiles (cp dir/*) "
        "leaves it behind"
    )

    # the newest is damaged (truncated data file): reported by path, the previous one is used
    data_file = next((ckpts / "step_6").glob("*.distcp"))
    data_file.write_bytes(data_file.read_bytes()[:100])
    (ckpts / "step_8").mkdir()  # an unfinished save: no meta.json
    assert checkpoint.latest(ckpts) == ckpts / "step_4"
    # named explicitly, it is an error naming the file (it used to be "OSError: [Errno 22]")
    with pytest.raises(ValueError, match=rf"is not a usable checkpoint: {data_file} has 100 bytes"):
        _train(
            tmp_path / "explicit", "trainer.max_steps=8", f"trainer.resume_from={ckpts / 'step_6'}"
        )
    assert f"skipping checkpoint {ckpts / 'step_6'}: {data_file} has 100 bytes" in caplog.text
    assert (
        f"skipping checkpoint {ckpts / 'step_8'}: {ckpts / 'step_8' / 'meta.json'} is missing"
        in caplog.text
    )

    # resuming step_4 -> 6 again reproduces the lost step_6 (a new run dir, so nothing is replaced)
    again = tmp_path / "again"
    with caplog.at_level(logging.INFO):
        m = _train(
            again, "trainer.max_steps=6", "trainer.checkpoint=true", f"trainer.resume_from={ckpts}"
        )
    assert m["num_steps"] == 6
    redone = checkpoint.load_model_state(again / "checkpoints" / "step_6")
    for key, value in final.items():
        torch.testing.assert_close(redone[key], value, rtol=0, atol=1e-6, msg=key)


@pytest.mark.parametrize(
    "poisoned",
    [
        "model table",
        # CI time (5 s each): the optimizer states' cases run with -m slow
        pytest.param("table optimizer state", marks=pytest.mark.slow),
        pytest.param("dense optimizer state", marks=pytest.mark.slow),
    ],
)
def test_a_checkpoint_with_values_that_are_not_finite_is_not_resumed(
    tmp_path: Path, poisoned: str
) -> None:
    """A reproduced bug: ``trainer.resume_from=auto`` resumed a checkpoint of a run that had
    diverged (NaN weights) and trained on from it without a word about the checkpoint. Any value
    that is not finite, in the weights (a table's shard too) or the optimizer state, is an error
    naming the checkpoint, the tensor and the earlier checkpoint to resume from instead: the
    newest before it, which ``auto`` does not take silently."""
    run = tmp_path / "run"
    overrides = (*TINY, "trainer.epochs=2", "trainer.max_steps=12", "trainer.checkpoint_every=4")
    rt = init_runtime("cpu")
    try:
        trainer = Trainer(to_config(compose_config(*overrides)), rt, run)
        trainer.fit()  # step_4, step_8, step_12: finite
        step_12 = run / "checkpoints" / "step_12"
        shutil.rmtree(step_12)  # saved again below, with a NaN in one tensor
        state = checkpoint.flatten_keys(
            checkpoint.checkpoint_state(trainer.model, trainer.optimizer, rank=0)
        )
        sharded = poisoned != "dense optimizer state"
        key = next(
            k
            for k, v in state.items()
            if k.startswith("model." if poisoned == "model table" else "optim.")
            and isinstance(v, ShardedTensor) == sharded
            and (sharded or (v.is_floating_point() and v.dim() > 0))
        )
        tensor = state[key].local_shards()[0].tensor if sharded else state[key]
        with torch.no_grad():
            tensor.view(-1)[-1] = math.nan  # the checkpoint's own tensor (views: the live one)
        trainer.save(1, 4)
    finally:
        close_runtime()
    message = (
        f"checkpoint {step_12} (step 12) holds values that are not finite (NaN or inf), first in "
        f"{key}: the run that saved it had diverged, and training on would start from them; "
        "resume from an earlier checkpoint by its path (the newest before it: "
        f"trainer.resume_from={str(run / 'checkpoints' / 'step_8')!r}), in a new run directory "
        "(another hydra.run.dir, and another trainer.checkpoint_dir if yours is absolute), "
        "perhaps with a lower learning rate (optim.lr, optim.sparse_lr)"
    )
    with pytest.raises(ValueError) as auto:
        _train(run, *overrides[len(TINY) :], "trainer.resume_from=auto")
    assert str(auto.value) == message
    with pytest.raises(ValueError) as by_path:
        _train(tmp_path / "new", *overrides[len(TINY) :], f"trainer.resume_from={step_12}")
    assert str(by_path.value) == message


def test_a_refused_diverged_checkpoint_in_an_absolute_checkpoint_dir_says_how_to_resume(
    tmp_path: Path,
) -> None:
    """A reproduced bug: with an absolute ``trainer.checkpoint_dir``, a checkpoint holding NaN
    was refused with "resume from an earlier checkpoint by its path (...step_4), in a new run
    directory (another hydra.run.dir)", and that resume was refused in turn ("goes back in this
    run: its checkpoint directory holds the newer step_8"): a new run directory keeps the same
    absolute checkpoint directory. The message says to change both, as that refusal does, and
    the resume it describes trains on."""
    ckpts = tmp_path / "ckpts"
    overrides = ("trainer.max_steps=8", "trainer.checkpoint_every=4")
    rt = init_runtime("cpu")
    try:
        conf = to_config(compose_config(*TINY, *overrides, f"trainer.checkpoint_dir={ckpts}"))
        trainer = Trainer(conf, rt, tmp_path / "run")
        trainer.fit()
        shutil.rmtree(ckpts / "step_8")  # saved again below, with a NaN in a dense weight
        with torch.no_grad():
            next(p for p in trainer.model.parameters() if p.dim() == 2).view(-1)[0] = math.nan
        trainer.save(0, 8)
    finally:
        close_runtime()
    with pytest.raises(ValueError) as error:
        _train(
            tmp_path / "run",
            *overrides,
            f"trainer.checkpoint_dir={ckpts}",
            "trainer.resume_from=auto",
        )
    assert (
        f"trainer.resume_from={str(ckpts / 'step_4')!r}), in a new run directory (another "
        "hydra.run.dir, and another trainer.checkpoint_dir if yours is absolute)"
    ) in str(error.value)
    resume = f"trainer.resume_from={ckpts / 'step_4'}"
    with pytest.raises(ValueError, match="goes back in this run"):  # a new run directory alone
        _train(tmp_path / "new", *overrides, f"trainer.checkpoint_dir={ckpts}", resume)
    other = f"trainer.checkpoint_dir={tmp_path / 'ckpts_new'}"
    assert _train(tmp_path / "newer", *overrides, other, resume)["num_steps"] == 8.0


DIVERGES = ("optim.lr=1e6", "optim.sparse_lr=1e6")  # finite weights after step 1, NaN from 2


def _not_finite_keys(trainer: Trainer) -> list[str]:
    """The keys of ``trainer``'s checkpoint state (RNG left out) holding a NaN or inf, in order."""
    state = checkpoint.checkpoint_state(trainer.model, trainer.optimizer, rank=0, ema=trainer.ema)
    return [
        k
        for k, v in checkpoint.flatten_keys(state).items()
        if not k.startswith("rng.")
        and any(
            t.is_floating_point() and not bool(torch.isfinite(t).all())
            for t in ([s.tensor for s in v.local_shards()] if isinstance(v, ShardedTensor) else [v])
        )
    ]


@pytest.mark.parametrize(
    "async_save", [False, pytest.param(True, marks=pytest.mark.slow)], ids=["sync", "async"]
)
def test_a_diverged_run_writes_no_checkpoint_that_a_resume_would_refuse(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, async_save: bool
) -> None:
    """A reproduced bug: a run that diverged (``optim.lr=1e6``) went on writing a checkpoint
    every ``trainer.checkpoint_every`` steps, each of them NaN and refused at resume, each of
    them the newest that ``trainer.resume_from=auto`` took. Such a checkpoint is not written (no
    directory), on every rank alike, with one warning naming the step, the first value that is
    not finite and the newest checkpoint kept, which stays the one ``auto`` resumes; an
    asynchronous save of an earlier step in flight is completed first."""
    run = tmp_path / "run"
    overrides = (*TINY, *DIVERGES, "trainer.max_steps=4", "trainer.checkpoint_every=1")
    conf = to_config(compose_config(*overrides, f"trainer.checkpoint_async={async_save}"))
    rt = init_runtime("cpu")
    try:
        with caplog.at_level(logging.INFO, logger="dmt.trainer"):
            trainer = Trainer(conf, rt, run)
            trainer.fit()
        bad = _not_finite_keys(trainer)
    finally:
        close_runtime()
    ckpts = run / "checkpoints"
    assert [p.name for _, p in checkpoint.step_dirs(ckpts)] == ["step_1"]
    assert checkpoint.latest(ckpts) == ckpts / "step_1"  # complete: what auto resumes
    assert all(
        bool(torch.isfinite(v).all())
        for v in checkpoint.load_model_state(ckpts / "step_1").values()
    )
    skipped = [r for r in caplog.records if "not written" in r.getMessage()]
    assert [(r.levelno, r.getMessage().split(":")[0]) for r in skipped] == [
        (logging.WARNING, "checkpoint of step 2 not written"),
        (logging.INFO, "checkpoint of step 3 not written"),
        (logging.INFO, "checkpoint of step 4 not written"),
    ]
    assert bad, "the run diverged"
    assert skipped[0].getMessage() == (
        "checkpoint of step 2 not written: the run has diverged (its state holds values that "
        f"are not finite, NaN or inf, first in {bad[0]}), and a resume would refuse it; this "
        f"run's newest checkpoint stays {ckpts / 'step_1'}"
    )


@pytest.mark.slow  # CI time: the suite keeps the every-N-steps case
def test_a_diverged_runs_checkpoint_at_the_end_is_not_written(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """``trainer.checkpoint=true``'s checkpoint at the end of a diverged run is not written
    either: the run ends with its metrics, and without a checkpoint, as it says. Its training
    loss is still finite here: the state that is not is the optimizer's."""
    run = tmp_path / "run"
    with caplog.at_level(logging.WARNING, logger="dmt.trainer"):
        metrics = _train(run, *DIVERGES, "trainer.max_steps=3", "trainer.checkpoint=true")
    assert metrics["num_steps"] == 3.0  # a loss of 1e33, and the tables' Adagrad state inf
    assert (run / "metrics.json").is_file()
    assert checkpoint.step_dirs(run / "checkpoints") == []
    warned = [r.getMessage() for r in caplog.records if "not written" in r.getMessage()]
    assert len(warned) == 1 and warned[0].startswith("checkpoint of step 3 not written: ")
    assert warned[0].endswith(f"; this run has no checkpoint in {run / 'checkpoints'}")


def test_checkpoint_keep_keeps_the_runs_newest_checkpoints_across_a_resume(tmp_path: Path) -> None:
    """``trainer.checkpoint_keep=2``: a run keeps its 2 newest checkpoints, not every one of
    ``trainer.checkpoint_every``, and resumes from the newest; a resume may change the setting
    (how the job runs), and counts its run's earlier checkpoints in."""
    run = tmp_path / "run"
    every = ("trainer.epochs=2", "trainer.checkpoint_every=2", "trainer.checkpoint=true")
    _train(run, *every, "trainer.max_steps=7", "trainer.checkpoint_keep=2")
    ckpts = run / "checkpoints"
    assert [p.name for _, p in checkpoint.step_dirs(ckpts)] == ["step_7", "step_6"]
    assert sorted(p.name for p in ckpts.iterdir()) == ["step_6", "step_7"]
    m = _train(
        run, *every, "trainer.max_steps=10", "trainer.checkpoint_keep=1", "trainer.resume_from=auto"
    )
    assert m["num_steps"] == 10.0
    assert [p.name for _, p in checkpoint.step_dirs(ckpts)] == ["step_10"]


@pytest.mark.slow  # CI time (about 5 s)
def test_a_resume_from_a_checkpoint_that_checkpoint_keep_deleted_says_it_is_gone(
    tmp_path: Path,
) -> None:
    """Reproduced: the same command run again (a ``torchrun --max-restarts`` restart) after
    ``trainer.checkpoint_keep=1`` deleted the ``step_N`` its ``trainer.resume_from`` names was
    refused as "``meta.json`` is missing (the save did not finish)": the save had finished, and
    the directory is not there at all. It says so, naming the newest complete checkpoint there."""
    run = tmp_path / "run"
    every = ("trainer.epochs=2", "trainer.checkpoint_every=2")
    _train(run, *every, "trainer.max_steps=2")
    step_2 = run / "checkpoints" / "step_2"
    again = (*every, "trainer.max_steps=6", "trainer.checkpoint_keep=1")
    assert _train(run, *again, f"trainer.resume_from={step_2}")["num_steps"] == 6.0
    assert [p.name for _, p in checkpoint.step_dirs(run / "checkpoints")] == ["step_6"]
    with pytest.raises(ValueError) as gone:
        _train(run, *again, f"trainer.resume_from={step_2}")
    assert str(gone.value) == (
        f"trainer.resume_from={str(step_2)!r}: no such directory (the newest complete "
        "checkpoint there: step_6)"
    )


def test_checkpoint_keep_deletes_no_checkpoint_of_another_run_in_a_shared_directory(
    tmp_path: Path,
) -> None:
    """A resume in another run directory that adopts an earlier run's absolute
    ``trainer.checkpoint_dir`` prunes only its own checkpoints (``meta.json``'s ``run_dir``):
    the earlier run's stay."""
    shared = tmp_path / "ckpts"
    every = ("trainer.epochs=2", "trainer.checkpoint_every=2", f"trainer.checkpoint_dir={shared}")
    _train(tmp_path / "a", *every, "trainer.max_steps=4")
    _train(
        tmp_path / "b",
        *every,
        "trainer.max_steps=8",
        "trainer.checkpoint_keep=1",
        "trainer.resume_from=auto",
    )
    names = [p.name for _, p in checkpoint.step_dirs(shared)]
    assert names == ["step_8", "step_4", "step_2"]
    owners = {n: checkpoint.read_meta(shared / n)["run_dir"] for n in names}
    assert owners == {
        "step_8": str((tmp_path / "b").resolve()),
        "step_4": str((tmp_path / "a").resolve()),
        "step_2": str((tmp_path / "a").resolve()),
    }


class MaskedTowerModule(TowerModule):
    """A user's tower module: attention over the tower's features under a causal mask, a
    buffer of ``-inf`` above the diagonal (a value the module set, not a diverged one)."""

    def __init__(self, num_features: int, embedding_dim: int) -> None:
        super().__init__()
        self.num_features, self.embedding_dim = num_features, embedding_dim
        self.num_vectors, self.dim = num_features, embedding_dim
        mask = torch.full((num_features, num_features), -math.inf).triu(1)
        self.register_buffer("mask", mask)
        self.proj = torch.nn.Linear(embedding_dim, embedding_dim)

    def forward(self, embs: torch.Tensor) -> torch.Tensor:
        self._check_input(embs)
        scores = embs @ embs.transpose(1, 2) + self.mask
        return self.proj(torch.softmax(scores, -1) @ embs)


@pytest.mark.parametrize("sptt", [False, True], ids=["dmt", "sptt"])
def test_a_modules_infinite_buffer_does_not_refuse_its_healthy_checkpoint(
    tmp_path: Path, sptt: bool
) -> None:
    """A reproduced bug: a run whose tower module holds an attention mask of ``-inf`` (a
    buffer) trained with a finite loss, and its resume was refused: "checkpoint .../step_4
    (step 4) holds values that are not finite (NaN or inf), first in
    model.model.towers.0.tower_module.mask: the run that saved it had diverged". The check
    reads the learned values (weights, tables, optimizer state), not the modules' buffers."""
    run = tmp_path / "run"
    towers = (
        ["model.partition.num_towers=1", "sptt=on", "sptt.local_world_size=1"]
        if sptt
        else ["model.partition.num_towers=2"]
    )
    overrides = (
        "+partition=naive",
        *towers,
        f"model.tower._target_={__name__}.MaskedTowerModule",
        "trainer.checkpoint=true",
    )
    first = _train(run, *overrides, "trainer.max_steps=4")
    assert math.isfinite(first["train_loss_last"])
    saved = checkpoint.tensor_keys(run / "checkpoints" / "step_4", prefix="")
    assert any(k.endswith("tower_module.mask") for k in saved), sorted(saved)
    resumed = _train(run, *overrides, "trainer.max_steps=8", "trainer.resume_from=auto")
    assert resumed["num_steps"] == 8.0 and math.isfinite(resumed["train_loss_last"])


@pytest.mark.slow  # 2-rank runs under torchrun (about 60 s on 2 shared cores)
def test_another_optimizer_on_two_ranks_starts_its_state_fresh(tmp_path: Path) -> None:
    """A reproduced bug: on 2+ ranks, a resume with another dense optimizer (Adam -> SGD with
    momentum) and trainer.resume_allow_config_change=true failed in DCP's load ("Missing key in
    checkpoint state_dict: optim.model.bottom.0.weight"): the dropped state left empty dicts,
    which DCP's plan on a rank that does not ask for every saved key took for tensors."""
    common = ["trainer=smoke", "logger=disabled", "trainer.progress_bar=false"]
    first = ["trainer.max_steps=4", "trainer.checkpoint=true", f"hydra.run.dir={tmp_path / 'a'}"]
    step_4 = tmp_path / "a" / "checkpoints" / "step_4"
    again = [
        "trainer.max_steps=6",
        *SGD,
        "+optim.dense.momentum=0.9",
        "trainer.resume_allow_config_change=true",
        f"trainer.resume_from={step_4}",
        "trainer.checkpoint=true",
        f"hydra.run.dir={tmp_path / 'b'}",
    ]
    for overrides in (first, again):
        cmd, env = torchrun("-m", "dmt.train", *common, *overrides)
        done = subprocess.run(
            cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300
        )
        assert done.returncode == 0, (done.stdout + done.stderr)[-4000:]
    meta = json.loads((tmp_path / "b" / "checkpoints" / "step_6" / "meta.json").read_text())
    assert meta["step"] == 6 and meta["world_size"] == 2
    # the dense state is SGD's with momentum, none of Adam's left
    saved = tmp_path / "b.pt"
    dcp_to_torch_save(tmp_path / "b" / "checkpoints" / "step_6", saved)
    optim = torch.load(saved, weights_only=False)["optim"]
    dense = {k: v for k, v in optim.items() if isinstance(v, dict) and "momentum_buffer" in v}
    assert dense and not [k for k, v in optim.items() if isinstance(v, dict) and "exp_avg" in v]


def test_the_dense_optimizers_implementation_changes_on_a_resume_with_its_state(
    tmp_path: Path,
) -> None:
    """``optim.dense_fused`` changes on a resume both ways, without
    ``trainer.resume_allow_config_change``: the fused Adam (the default) resumes the looping
    one's checkpoint (``optim.dense_fused=false``) and the loop resumes the fused one's, with
    their state (the step counts and moments), each to an uninterrupted looping run's weights
    and state to rounding."""
    loop = "optim.dense_fused=false"
    common = ("trainer.checkpoint_every=2",)
    _train(tmp_path / "loop", *common, "trainer.max_steps=6", loop)
    ckpt = {name: tmp_path / name / "checkpoints" for name in ("loop", "fused", "back")}
    resume = "trainer.resume_from={}".format
    _train(tmp_path / "fused", *common, "trainer.max_steps=4", resume(ckpt["loop"] / "step_2"))
    _train(
        tmp_path / "back", *common, "trainer.max_steps=6", loop, resume(ckpt["fused"] / "step_4")
    )

    def saved(step_dir: Path) -> tuple[dict[str, torch.Tensor], dict[str, dict[str, torch.Tensor]]]:
        dcp_to_torch_save(step_dir, tmp_path / "saved.pt")
        optim = torch.load(tmp_path / "saved.pt", weights_only=False)["optim"]
        dense = {k: v for k, v in optim.items() if isinstance(v, dict) and "exp_avg" in v}
        return checkpoint.load_model_state(step_dir, ema=False), dense

    for name, step, fused in (("loop", 6, "false"), ("fused", 4, "true"), ("back", 6, "false")):
        config = (ckpt[name] / f"step_{step}" / "config.yaml").read_text()
        assert f"dense_fused: {fused}\n" in config, name
    for resumed, step in (("fused", 4), ("back", 6)):
        model, dense = saved(ckpt[resumed] / f"step_{step}")
        ref_model, ref_dense = saved(ckpt["loop"] / f"step_{step}")
        assert model.keys() == ref_model.keys() and dense.keys() == ref_dense.keys()
        assert len(dense) >= 4
        for key, value in ref_model.items():
            torch.testing.assert_close(model[key], value, msg=f"{resumed} {key}")
        for key, state in ref_dense.items():
            assert float(dense[key]["step"]) == float(state["step"]) == step, (resumed, key)
            for name in ("exp_avg", "exp_avg_sq"):
                torch.testing.assert_close(
                    dense[key][name], state[name], msg=f"{resumed} {key}.{name}"
                )
