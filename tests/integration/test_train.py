"""The Hydra training app end to end (single process, TorchRec DMP on gloo)."""

from __future__ import annotations

import csv
import gc
import itertools
import json
import logging
import math
import os
import subprocess
import sys
import threading
import time
import weakref

import numpy as np
import pytest
import torch
import yaml
from torchrec.distributed.embeddingbag import ShardedEmbeddingBagCollection
from torchrec.distributed.train_pipeline import EvalPipelineSparseDist, TrainPipelineSparseDist

from dmt import checkpoint
from dmt.config import Config, use_pipeline
from dmt.metrics import click_probabilities
from dmt.runtime import close_runtime, init_runtime
from dmt.train import sweep_value, to_config, train
from dmt.trainer import LAST_STEPS, Trainer, unwrap
from tests.conftest import REPO, compose_config
from tests.unit.test_criteo_preprocess import make_rows, write

REQUIRED = [
    "val_auc",
    "test_auc",
    "test_ne",
    "test_logloss",
    "train_samples_per_s",
    "num_train_samples",
    "oracle_test_auc",
]
TINY = [
    "logger=disabled",
    "trainer.progress_bar=false",
    "data.synthetic.num_train=4096",
    "data.synthetic.num_val=1024",
    "data.synthetic.num_test=1024",
    "data.batch_size=256",
]


@pytest.mark.parametrize("model", ["dlrm", "dcn"])
def test_two_step_smoke_writes_metrics(tmp_path, model):
    metrics = train(
        compose_config(*TINY, f"model={model}", "trainer=smoke", "trainer.eval_max_batches=-1"),
        tmp_path,
    )
    written = json.loads((tmp_path / "metrics.json").read_text())
    for key in REQUIRED:
        assert key in written, key
    assert written["num_steps"] == 2 and written["num_train_samples"] == 512
    assert written == pytest.approx(metrics, nan_ok=True)


def test_a_capped_evaluation_writes_no_oracle_auc_as_the_readme_says(tmp_path):
    """Reproduced: the README said every run on planted synthetic data writes
    ``oracle_test_auc``; one that caps its evaluation (``trainer.eval_max_batches`` > 0, as
    ``trainer=smoke`` does) writes none, nor ``oracle_val_auc``."""
    train(compose_config(*TINY, "trainer=smoke"), tmp_path)
    written = json.loads((tmp_path / "metrics.json").read_text())
    assert "test_auc" in written
    assert not {"oracle_test_auc", "oracle_val_auc"} & written.keys()
    readme = " ".join((REPO / "README.md").read_text().split())
    assert (
        "`oracle_test_auc` and `oracle_val_auc` on planted synthetic data evaluated whole "
        "(`trainer.eval_max_batches` <= 0, the default; `trainer=smoke` evaluates one batch)"
    ) in readme


def test_default_dlrm_gets_within_003_of_the_oracle(tmp_path):
    """The README's main job (default config, planted synthetic data)."""
    m = train(compose_config("logger=disabled", "trainer.progress_bar=false"), tmp_path)
    assert m["oracle_test_auc"] > 0.75
    assert m["test_auc"] >= m["oracle_test_auc"] - 0.03, m


def _run(
    overrides: list[str], out, device: str = "cpu"
) -> tuple[list[float], dict[str, torch.Tensor]]:
    conf = to_config(compose_config(*TINY, *overrides, f"trainer.device={device}"))
    rt = init_runtime(device)
    try:
        trainer = Trainer(conf, rt, out)
        losses = trainer.fit(keep_losses=True).losses
        state = {}
        for k, v in trainer.model.state_dict().items():
            t = v.local_shards()[0].tensor if hasattr(v, "local_shards") else v
            state[k] = t.detach().clone()
        # FBGEMM's fused-optimizer step (Adam's bias correction on GPUs), in no state dict
        kernels = checkpoint.fused_table_modules(trainer.model)
        assert kernels
        # iter is what checkpoints carry, iter_cpu what the kernel computes with
        state["fused optimizer step"] = torch.tensor(
            [[int(m.iter), int(m.iter_cpu)] for m in kernels]
        )
        assert unwrap(trainer.model).embedding_dim == 16
    finally:
        close_runtime()
    return losses, state


def test_resume_reproduces_an_uninterrupted_run(tmp_path):
    common = [
        "optim.schedule.warmup_steps=5",
        "data.shuffle=true",
        "trainer.epochs=2",
    ]  # 16 steps/epoch
    full_losses, full_state = _run([*common, "trainer.max_steps=24"], tmp_path / "full")
    first, _ = _run([*common, "trainer.max_steps=12", "trainer.checkpoint=true"], tmp_path / "a")
    ckpt = tmp_path / "a" / "checkpoints"
    assert (ckpt / "step_12" / "meta.json").exists()
    second, resumed_state = _run(
        [*common, "trainer.max_steps=24", f"trainer.resume_from={ckpt}"], tmp_path / "b"
    )
    assert len(first) == 12 and len(second) == 12
    assert first + second == full_losses  # bit-identical loss sequence across the epoch boundary
    assert resumed_state.keys() == full_state.keys()
    for k in full_state:
        torch.testing.assert_close(resumed_state[k], full_state[k], rtol=0, atol=0, msg=k)


@pytest.mark.parametrize(
    "device",
    [
        "cpu",
        pytest.param(
            "cuda",
            marks=pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU"),
        ),
    ],
)
def test_resume_with_dropout_draws_the_masks_of_an_uninterrupted_run_cpu_and_cuda(tmp_path, device):
    """Dropout draws from the device's generator: a checkpoint restores the CPU's and, on a GPU,
    the GPU's (CUDA's was not saved: a resumed run drew the masks of its first steps again)."""
    common = ["model.dropout=0.3", "trainer.epochs=1"]  # 16 steps
    full_losses, full_state = _run([*common, "trainer.max_steps=12"], tmp_path / "full", device)
    first, _ = _run(
        [*common, "trainer.max_steps=6", "trainer.checkpoint=true"], tmp_path / "a", device
    )
    ckpt = tmp_path / "a" / "checkpoints"
    second, state = _run(
        [*common, "trainer.max_steps=12", f"trainer.resume_from={ckpt}"], tmp_path / "b", device
    )
    # CUDA kernels may sum in another order from run to run; a replayed mask moves far more
    tol = {"rtol": 0, "atol": 0} if device == "cpu" else {"rtol": 1e-5, "atol": 1e-6}
    torch.testing.assert_close(torch.tensor(first + second), torch.tensor(full_losses), **tol)
    for k in full_state:
        torch.testing.assert_close(state[k].cpu(), full_state[k].cpu(), **tol, msg=k)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="fused sparse Adam needs a GPU")
def test_resume_with_fused_adam_continues_its_bias_correction_cuda(tmp_path):
    """FBGEMM's Adam counts its bias-correction step outside every state dict; the checkpoint
    carries it (``fused_optimizer_step``), so a resumed run takes the uninterrupted run's steps
    (restarting the count at 1 would make its first sparse updates 0.15-0.3x as large)."""
    common = ["optim=adam", "optim.schedule.warmup_steps=2", "trainer.epochs=1"]  # 16 steps
    full_losses, full_state = _run([*common, "trainer.max_steps=12"], tmp_path / "full", "cuda")
    first, _ = _run(
        [*common, "trainer.max_steps=6", "trainer.checkpoint=true"], tmp_path / "a", "cuda"
    )
    ckpt = tmp_path / "a" / "checkpoints"
    assert checkpoint.read_meta(ckpt / "step_6")["fused_optimizer_step"] >= 6
    second, state = _run(
        [*common, "trainer.max_steps=12", f"trainer.resume_from={ckpt}"], tmp_path / "b", "cuda"
    )
    tol = {"rtol": 1e-5, "atol": 1e-6}  # CUDA kernels may sum in another order run to run
    torch.testing.assert_close(torch.tensor(first + second), torch.tensor(full_losses), **tol)
    assert state.keys() == full_state.keys()
    for k in full_state:
        torch.testing.assert_close(state[k].cpu(), full_state[k].cpu(), **tol, msg=k)


@pytest.mark.parametrize(
    ("device", "optim"),
    [
        ("cpu", "optim=default"),
        pytest.param(
            "cuda",
            "optim=adam",
            marks=pytest.mark.skipif(
                not torch.cuda.is_available(), reason="fused sparse Adam needs a GPU"
            ),
        ),
    ],
)
def test_evaluation_leaves_the_fused_optimizer_step_to_training_cpu_and_cuda(
    tmp_path, device, optim
):
    """Reproduced: FBGEMM's fused optimizers count every forward as a step, evaluation's too
    (row-wise Adagrad's counter, on CPU; Adam's bias correction, on GPUs): 12 steps evaluated
    every 4 counted 16, one more per evaluated batch, and a GPU run's sparse Adam updates
    depended on ``trainer.eval_every``. Evaluation keeps the count: the same weights either
    way."""
    common = [optim, "optim.schedule.warmup_steps=2", "trainer.epochs=1", "trainer.max_steps=12"]
    _, every = _run([*common, "trainer.eval_every=4"], tmp_path / "every", device)
    _, at_end = _run(common, tmp_path / "end", device)
    assert every["fused optimizer step"][:, 0].tolist() == [12] * len(every["fused optimizer step"])
    # CUDA kernels may sum in another order from run to run
    tol = {"rtol": 0, "atol": 0} if device == "cpu" else {"rtol": 1e-5, "atol": 1e-6}
    assert every.keys() == at_end.keys()
    for k in every:
        torch.testing.assert_close(every[k].cpu(), at_end[k].cpu(), **tol, msg=k)


def test_a_model_whose_logits_overflow_has_nan_metrics_with_a_warning(tmp_path):
    """A reproduced bug: infinite logits (an overflow: a diverged model) became probabilities of
    exactly 1 or 0, which the metrics clamp: evaluation reported finite numbers (AUC 0.5, NE 7
    to 21) without a word, for metrics.json and a sweeper to take as a result. NaN logits gave
    NaN metrics and a warning; infinite ones do too."""
    rt = init_runtime("cpu")
    try:
        trainer = Trainer(to_config(compose_config(*TINY, "trainer=smoke")), rt, tmp_path)
        linear = [m for m in unwrap(trainer.model).modules() if isinstance(m, torch.nn.Linear)]
        for logit in (math.inf, -math.inf, math.nan):
            with torch.no_grad():
                linear[-1].bias.fill_(logit)  # the top MLP's output: every logit
            with pytest.warns(RuntimeWarning, match=r"^1024 of 1024 predictions are not finite"):
                metrics = trainer.evaluate(trainer.data.val)
            assert metrics["num_samples"] == 1024
            assert all(math.isnan(metrics[k]) for k in ("auc", "logloss", "ne", "calibration"))
    finally:
        close_runtime()


@pytest.mark.parametrize(
    "overrides",
    [["optim.lr=1e6"], ["optim.lr=1e6", "optim.sparse_lr=1e6"]],
    ids=["inf-loss-finite-metrics", "nan-loss"],
)
def test_a_diverging_run_warns_at_the_step_its_loss_stops_being_finite(tmp_path, caplog, overrides):
    """A reproduced bug: a run whose training loss became inf or NaN said nothing of it in
    train.log or on the console; with ``optim.lr=1e6`` its saturated model's metrics stayed
    finite (AUC 0.5, no warning at all), with both LRs only the final evaluation warned, without
    a step. Now the first step whose loss is not finite is a warning, once, between log steps
    too (``trainer.log_every=4``). And the finite AUC was a sweep's result: it is a failed
    trial."""
    conf = to_config(
        compose_config(
            *TINY, "trainer=smoke", "trainer.max_steps=8", "trainer.log_every=4", *overrides
        )
    )
    rt = init_runtime("cpu")
    try:
        with caplog.at_level(logging.WARNING, logger="dmt.trainer"):
            result = Trainer(conf, rt, tmp_path).fit(keep_losses=True)
    finally:
        close_runtime()
    first = next(i for i, v in enumerate(result.losses) if not math.isfinite(v)) + 1
    assert 1 < first < 4 and not all(map(math.isfinite, result.losses[first:]))
    warned = [r.getMessage() for r in caplog.records if "diverged" in r.getMessage()]
    assert warned == [
        f"training diverged: train/loss is {result.losses[first - 1]} at step {first} (not "
        "finite; history.jsonl writes it as null); a lower learning rate (optim.lr, "
        "optim.sparse_lr) may help"
    ]
    assert math.isfinite(result.metrics["val_auc"]) == (overrides == ["optim.lr=1e6"])
    assert math.isnan(sweep_value(result.metrics, "val_auc"))


def test_resume_from_a_periodic_checkpoint_reproduces_an_uninterrupted_run(tmp_path):
    """``trainer.checkpoint_every`` saves mid-run; resuming one continues at exactly its step and
    data position: mid-epoch (step 20 = epoch 1, batch 4) and at an epoch boundary (step 16 =
    epoch 1, batch 0), each to the uninterrupted run's losses and weights."""
    common = [
        "optim.schedule.warmup_steps=5",
        "data.shuffle=true",
        "trainer.epochs=2",
    ]  # 16 steps/epoch
    common += ["trainer.max_steps=24"]
    full_losses, full_state = _run([*common, "trainer.checkpoint_every=4"], tmp_path / "full")
    ckpt = tmp_path / "full" / "checkpoints"
    assert [p.name for _, p in checkpoint.step_dirs(ckpt)] == [
        f"step_{s}" for s in (24, 20, 16, 12, 8, 4)
    ]
    for step, epoch, batch in [(4, 0, 4), (12, 0, 12), (16, 1, 0), (20, 1, 4)]:
        meta = json.loads((ckpt / f"step_{step}" / "meta.json").read_text())
        assert (meta["step"], meta["epoch"], meta["batch_in_epoch"]) == (step, epoch, batch), meta
    for step in (20, 16):
        losses, state = _run(
            [*common, f"trainer.resume_from={ckpt / f'step_{step}'}"], tmp_path / f"from_{step}"
        )
        assert losses == full_losses[step:], step  # bit-identical: the same batches, in order
        assert state.keys() == full_state.keys()
        for k in full_state:
            torch.testing.assert_close(state[k], full_state[k], rtol=0, atol=0, msg=f"{step} {k}")


def test_resume_from_a_directory_without_checkpoints_fails_clearly(tmp_path):
    with pytest.raises(ValueError, match=r"trainer.resume_from=.*no complete checkpoint"):
        train(compose_config(*TINY, "trainer=smoke", f"trainer.resume_from={tmp_path}"), tmp_path)


def _cli(*args: str, cwd) -> subprocess.CompletedProcess:
    exe = os.path.join(os.path.dirname(sys.executable), args[0])
    return subprocess.run([exe, *args[1:]], cwd=cwd, capture_output=True, text=True, timeout=300)


@pytest.mark.slow  # 5 CLI runs, 20 s (multirun also: test_run_artifacts.py)
def test_cli_run_and_multirun_sweep(tmp_path):
    run = _cli("dmt-train", *TINY, "trainer=smoke", f"hydra.run.dir={tmp_path}/run", cwd=tmp_path)
    assert run.returncode == 0, run.stderr[-3000:]
    assert "val_auc=" in run.stdout and (tmp_path / "run" / "metrics.json").exists()
    sweep = _cli(
        "dmt-train",
        "-m",
        *TINY,
        "trainer=smoke",
        "model=dlrm,dcn",
        "optim.lr=1e-3,2e-3",
        f"hydra.sweep.dir={tmp_path}/sweep",
        cwd=tmp_path,
    )
    assert sweep.returncode == 0, sweep.stderr[-3000:]
    assert len(list((tmp_path / "sweep").glob("*/metrics.json"))) == 4
    # dmt.trials.TrialsTable: the points side by side, the swept overrides as columns
    with open(tmp_path / "sweep" / "trials.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    assert [(r["trial"], r["status"], r["model"], r["optim.lr"]) for r in rows] == [
        ("0", "ok", "dlrm", "0.001"),
        ("1", "ok", "dlrm", "0.002"),
        ("2", "ok", "dcn", "0.001"),
        ("3", "ok", "dcn", "0.002"),
    ]
    for r in rows:
        metrics = json.loads((tmp_path / "sweep" / r["trial"] / "metrics.json").read_text())
        assert float(r["val_auc"]) == metrics["val_auc"]


@pytest.mark.slow  # two Optuna multiruns (about 40 s on 2 shared cores)
def test_an_optuna_sweep_goes_on_past_a_diverged_trial(tmp_path):
    """A reproduced bug: a diverged trial returned NaN, which Optuna refuses ("the objective
    function returned nan"); the sweeper's own fallback then failed too, and the multirun stopped
    there without its other trials, its trials table or optimization_results.yaml. And a sweep
    whose every trial fails, which the sweeper ends with an error, keeps its trials table."""
    optuna = [*TINY, "trainer=smoke", "hydra/sweeper=optuna", "hydra.sweeper.direction=maximize",
              "hydra.sweeper.max_failure_rate=1.0", "hydra.sweeper.sampler.seed=1234"]  # fmt: skip
    sweep = _cli(
        "dmt-train", "-m", *optuna, "hydra.sweeper.n_trials=3", "optim.lr=choice(0.001,1e9)",
        f"hydra.sweep.dir={tmp_path}/sweep", cwd=tmp_path,
    )  # fmt: skip
    assert sweep.returncode == 0, sweep.stderr[-3000:]
    with open(tmp_path / "sweep" / "trials.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == 3 and {r["optim.lr"] for r in rows} == {"0.001", "1000000000.0"}
    for r in rows:
        assert r["status"] == ("ok" if r["optim.lr"] == "0.001" else "failed"), rows
    best = (tmp_path / "sweep" / "optimization_results.yaml").read_text()
    assert "optim.lr: 0.001" in best
    assert "this run diverged" in sweep.stderr + sweep.stdout
    failed = _cli(
        "dmt-train", "-m", *optuna, "hydra.sweeper.n_trials=2", "optim.lr=choice(1e9)",
        f"hydra.sweep.dir={tmp_path}/failed", cwd=tmp_path,
    )  # fmt: skip
    assert failed.returncode != 0 and "No trials are completed yet" in failed.stderr
    table = (tmp_path / "failed" / "trials.md").read_text()
    assert table.startswith("no trial has a value of 'val_auc': every trial failed")
    assert table.count("| failed |") == 2 and "| optim.lr |" in table  # the swept key


def test_inspect_cli_writes_inspect_json(tmp_path):
    res = _cli("dmt-inspect", "experiment=paper_dlrm", f"hydra.run.dir={tmp_path}", cwd=tmp_path)
    assert res.returncode == 0, res.stderr[-3000:]
    report = json.loads((tmp_path / "inspect.json").read_text())
    cards = yaml.safe_load((REPO / "dmt/conf/data/criteo_1tb_synthetic.yaml").read_text())
    cards = cards["synthetic"]["cardinalities"]

    def mlp(inputs: int, sizes: list[int]) -> int:  # weights and biases
        return sum((i + 1) * o for i, o in zip([inputs, *sizes[:-1]], sizes, strict=True))

    # the paper's DLRM, counted by hand: 26 tables of dim 128, bottom 512-256-128 over 13 dense
    # inputs, top 1024-1024-512-256-1 over the dense vector and the 27 vectors' 351 pairs
    tables = 128 * sum(cards)
    dense = mlp(13, [512, 256, 128]) + mlp(128 + 27 * 26 // 2, [1024, 1024, 512, 256, 1])
    assert len(cards) == 26 and report["num_parameters"] == tables + dense == 22_779_236_097
    assert abs(report["train_mflops_per_sample"] - 14.74) < 0.01


def test_bad_config_fails_before_training(tmp_path):
    """Refused in one line before Hydra makes the run directory: a failed run left one behind
    (.hydra/, an empty log, run.lock), and the error came under a traceback."""
    run_dir = tmp_path / "run"
    res = _cli(
        "dmt-train",
        "model.interaction._target_=resnet.ResNet",
        f"hydra.run.dir={run_dir}",
        cwd=REPO,
    )
    assert res.returncode == 1
    assert res.stderr.startswith("Error: model.interaction: cannot build _target_='resnet.ResNet'")
    assert "Traceback" not in res.stderr
    assert not run_dir.exists()


def test_training_without_a_full_batch_stops_before_training(tmp_path):
    """Bug: ``data.synthetic.num_train`` below one batch, or a preprocessed training split of 0
    rows, died with a ZeroDivisionError in the trainer."""
    small = [*TINY, "data.synthetic.num_train=100", "data.batch_size=512"]
    with pytest.raises(ValueError, match=r"^data\.synthetic\.num_train=100 is smaller than one "
                       r"batch \(data\.batch_size=512\)"):  # fmt: skip
        train(compose_config(*small), tmp_path / "synthetic")
    assert not (tmp_path / "synthetic" / "metrics.json").exists()

    # Criteo: a raw file whose every row is bad (CRLF) fails in preprocessing, before training
    raw = tmp_path / "train.txt"
    row = "\t".join(["1", *["3"] * 13, *["0000abcd"] * 26])
    raw.write_bytes((row + "\r\n").encode() * 300)
    criteo = ["logger=disabled", "trainer.progress_bar=false", "data=criteo_sample",
              f"data.criteo.raw_path={raw}", f"data.criteo.preprocessed_dir={tmp_path / 'prep'}",
              "data.criteo.skip_bad_rows=true", "data.criteo.num_workers=1"]  # fmt: skip
    with pytest.raises(ValueError, match=r"failed: no training rows: all 255 lines read for the "
                       r"train split of .*train\.txt.* Windows \(CRLF\) line endings"):  # fmt: skip
        train(compose_config(*criteo), tmp_path / "criteo")
    assert not (tmp_path / "prep").exists()


def _local_state(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    out = {}
    for k, v in model.state_dict().items():
        t = v.local_shards()[0].tensor if hasattr(v, "local_shards") else v
        out[k] = t.detach().clone()
    return out


def test_another_optimizer_is_a_config_not_code(tmp_path):
    """optim.dense and optim.sparse are built from their _target_: RMSprop on the dense part and
    plain SGD fused into the embedding kernels train with no change to dmt."""
    conf = to_config(
        compose_config(
            *TINY,
            "trainer.max_steps=4",
            "optim.dense._target_=torch.optim.RMSprop",
            "+optim.dense.alpha=0.9",
            "optim.sparse._target_=torch.optim.SGD",
            "~optim.sparse.eps",  # SGD takes none
        )
    )
    rt = init_runtime("cpu")
    try:
        trainer = Trainer(conf, rt, tmp_path)
        before = _local_state(trainer.model)
        losses = trainer.fit().losses
        state = trainer.optimizer.state_dict()["state"]
        after = _local_state(trainer.model)
    finally:
        close_runtime()
    assert len(losses) == 4 and all(map(torch.isfinite, map(torch.tensor, losses)))
    dense_state = {k for v in state.values() for k in v}
    assert "square_avg" in dense_state  # RMSprop's
    assert not any("momentum" in k or k.endswith("sum") for k in dense_state)  # SGD keeps none
    tables = [k for k in before if "embedding_bags" in k]
    assert tables and all(not torch.equal(before[k], after[k]) for k in tables)
    assert any(not torch.equal(before[k], after[k]) for k in before if k not in tables)


def test_a_schedule_of_its_own_peak_lrs_is_refused_with_a_remedy_a_dmt_model_takes(tmp_path):
    """Reproduced: the refusal of a schedule that sets the groups' peak LRs out of the
    proportion of optim.sparse_lr and optim.lr said "give it one LR per param group in that
    proportion", which no DMT model takes: the config's check builds it over two groups
    (tables, dense), the trainer over one per table group of the sharded model (five here), so
    ``max_lr=[0.5, 0.05]`` passed the check and failed in the trainer after the data was read,
    and five LRs failed the check. Its remedies: a schedule that multiplies each group's LR, or
    optim.sparse_lr equal to optim.lr (one ``max_lr`` then keeps the proportion)."""
    from dmt.optim import check_optim  # noqa: PLC0415

    def one_cycle(*overrides: str, max_lr: object) -> Config:
        conf = to_config(compose_config(*TINY, "experiment=dmt_4t_dlrm", *overrides))
        conf.optim.schedule = {
            "_target_": "torch.optim.lr_scheduler.OneCycleLR",
            "max_lr": max_lr,
            "cycle_momentum": False,
        }
        return conf

    refused = one_cycle("optim.lr=0.01", "optim.sparse_lr=0.1", max_lr=0.05)
    with pytest.raises(ValueError, match="one LR per group cannot be given") as err:
        check_optim(refused.optim)
    assert "give it one LR per param group" not in str(err.value)
    conf = one_cycle("optim.lr=0.01", "optim.sparse_lr=0.01", "trainer.max_steps=2", max_lr=0.05)
    check_optim(conf.optim)
    rt = init_runtime("cpu")
    try:
        trainer = Trainer(conf, rt, tmp_path)
        groups = trainer.optimizer.param_groups
        assert len(groups) > 2  # not the two of the config's check
        assert {g["initial_lr"] for g in groups} == {0.05 / 25}  # OneCycleLR's div_factor
        assert len(trainer.fit().losses) == 2
    finally:
        close_runtime()


def test_a_finished_job_leaves_no_sharded_model_alive(tmp_path):
    """The next job of a multirun builds its tables beside nothing: TorchRec's sharded modules
    sit in reference cycles, which ``train`` collects before returning."""

    def sharded() -> set[int]:
        return {id(o) for o in gc.get_objects() if isinstance(o, ShardedEmbeddingBagCollection)}

    before = sharded()  # other tests' garbage, if any
    train(compose_config(*TINY, "trainer=smoke"), tmp_path)
    assert sharded() - before == set()


def test_a_failed_job_leaves_no_model_alive_while_its_error_is_kept(tmp_path, monkeypatch):
    """A reproduced bug: a Hydra multirun keeps a failed job's exception (its ``JobReturn``) for
    the rest of the sweep, and its traceback held the job's trainer, model and tables (on a
    GPU, the next jobs built theirs beside them)."""

    def trainers() -> list[Trainer]:
        gc.collect()
        return [o for o in gc.get_objects() if isinstance(o, Trainer)]

    assert trainers() == []  # other tests' trainers, if any, are gone
    steps, count = Trainer.run_steps, itertools.count()

    def fail_at_the_third_step(self, batches):  # type: ignore[no-untyped-def]
        for loss in steps(self, batches):
            if next(count) == 2:
                raise RuntimeError("the third step failed")
            yield loss

    monkeypatch.setattr(Trainer, "run_steps", fail_at_the_third_step)
    with pytest.raises(RuntimeError, match="the third step failed") as err:
        train(compose_config(*TINY), tmp_path)
    assert err.value.__traceback__ is not None  # held, as a multirun holds it
    assert trainers() == []


@pytest.mark.parametrize("where", ["training", "evaluation"])
def test_an_error_in_training_or_evaluation_stops_the_criteo_prefetching_thread(tmp_path, where):
    """A reproduced bug: a step or an evaluation batch that raised left the Criteo loader's
    prefetching thread running (polling every 50 ms, its batches held) for as long as the
    exception was kept: a Hydra multirun keeps a failed job's for the rest of its jobs."""
    raw = write(tmp_path / "raw.tsv", make_rows(400, seed=1))  # 340 train, 30 validation rows
    criteo = ["data=criteo_sample", f"data.criteo.raw_path={raw}", "data.criteo.num_workers=1",
              f"data.criteo.preprocessed_dir={tmp_path / 'prep'}", "data.criteo.prefetch_batches=2",
              "data.batch_size=32", "data.eval_batch_size=4"]  # fmt: skip
    conf = to_config(compose_config(*TINY, *criteo))
    try:
        trainer = Trainer(conf, init_runtime("cpu"), tmp_path / "run")
        forwards = itertools.count()

        def fail_the_third(module, inputs):  # type: ignore[no-untyped-def]
            if next(forwards) == 2:
                raise RuntimeError("the third forward failed")

        trainer.model.register_forward_pre_hook(fail_the_third)
        run = trainer.fit if where == "training" else lambda: trainer.evaluate(trainer.data.val)
        with pytest.raises(RuntimeError, match="the third forward failed") as err:
            run()
        # the exception is still held (err), as a multirun holds a failed job's
        assert err.value.__traceback__ is not None
        assert [t for t in threading.enumerate() if t.name == "criteo-prefetch"] == []
    finally:
        close_runtime()


class _SlowRead:
    """A split whose batch ``slow`` takes a second to read (a disk, a parser), and that says when
    its reading starts."""

    def __init__(self, inner, slow: int) -> None:  # type: ignore[no-untyped-def]
        self.inner, self.slow, self.reading = inner, slow, threading.Event()

    def num_batches(self) -> int:
        return self.inner.num_batches()

    def batches(self, epoch, start=0):  # type: ignore[no-untyped-def]
        for i, batch in enumerate(self.inner.batches(epoch, start)):
            if i == self.slow:
                self.reading.set()
                time.sleep(1.0)
            yield batch


@pytest.mark.parametrize("where", ["forward", "metrics"])
def test_an_error_in_pipelined_evaluation_is_raised_as_itself(tmp_path, monkeypatch, where):
    """A reproduced bug: TorchRec's eval pipeline reads batches ahead in a thread, and its reset
    does not wait for it; an evaluation that raised (a batch's forward, or the loop around it: a
    KeyboardInterrupt) while that thread read the next batch closed the batches under it, and
    ``ValueError: generator already executing`` replaced the error that ended evaluation."""
    conf = to_config(
        compose_config(*TINY, "trainer.pipeline_world_of_one=true", "data.eval_batch_size=128")
    )
    try:
        trainer = Trainer(conf, init_runtime("cpu"), tmp_path)
        assert isinstance(trainer.eval_pipeline, EvalPipelineSparseDist)
        # batch 1's forward runs while the pipeline's thread reads batch 3
        source, calls = _SlowRead(trainer.data.val, slow=3), itertools.count()

        def fail_the_second() -> None:
            if next(calls) == 1:
                assert source.reading.wait(10)
                raise RuntimeError(f"the second {where} failed")

        if where == "forward":
            linear = next(m for m in trainer.model.modules() if isinstance(m, torch.nn.Linear))
            linear.register_forward_pre_hook(lambda module, inputs: fail_the_second())
        else:

            def failing(logits: torch.Tensor) -> torch.Tensor:
                fail_the_second()
                return click_probabilities(logits)

            monkeypatch.setattr("dmt.trainer.click_probabilities", failing)
        with pytest.raises(RuntimeError, match=f"^the second {where} failed$"):
            trainer.evaluate(source)
        assert trainer.evaluate(trainer.data.val)["num_samples"] == 1024  # the pipeline is whole
    finally:
        close_runtime()


class _CountingTrainer(Trainer):
    """Records, at every log step, how many of the run's step losses are still alive."""

    def run_steps(self, batches):  # type: ignore[no-untyped-def]
        self.refs = getattr(self, "refs", [])
        for loss in super().run_steps(batches):
            self.refs.append(weakref.ref(loss))
            yield loss

    def _log_train(self, loss: float, train_time_s: float) -> None:
        gc.collect()
        self.alive = [*getattr(self, "alive", []), sum(r() is not None for r in self.refs)]
        super()._log_train(loss, train_time_s)


def test_a_run_holds_the_losses_of_one_log_interval_only(tmp_path):
    """On a GPU each step's loss is a device block: a run of 1M steps kept 0.5 GB of them. The
    losses since the last log step are read back there (one copy), and the rest freed."""
    conf = to_config(compose_config(*TINY, "trainer.log_every=4", "trainer.eval_every=0"))
    rt = init_runtime("cpu")
    try:
        trainer = _CountingTrainer(conf, rt, tmp_path)
        result = trainer.fit()
    finally:
        close_runtime()
    assert len(result.losses) == 16 and all(math.isfinite(v) for v in result.losses)
    # at step 4 k the losses are read back and freed, but the loop's last one (all 4 k before)
    assert trainer.alive == [1, 1, 1, 1]


def test_a_run_holds_the_losses_of_its_last_steps_only(tmp_path):
    """A Terabyte epoch (8.6M steps) kept a float per step on each rank, about 275 MB: the
    result holds the last ``LAST_STEPS`` losses (``train_loss_last``'s) whatever the run's
    length, and the numbers reported are those of every step's losses (here all logged)."""
    conf = to_config(
        compose_config(
            *TINY,
            "data.batch_size=64",
            "trainer.max_steps=55",
            "trainer.log_every=1",
            "trainer.eval_every=0",
            "model.embedding_dim=8",
            "model.bottom_mlp=[16,8]",
            "model.top_mlp=[16,1]",
        )
    )
    rt = init_runtime("cpu")
    try:
        result = Trainer(conf, rt, tmp_path).fit()
    finally:
        close_runtime()
    history = [json.loads(line) for line in (tmp_path / "history.jsonl").read_text().splitlines()]
    every_step = [r["train/loss"] for r in history if "train/loss" in r]
    assert len(every_step) == 55 and LAST_STEPS == 50
    assert result.losses == every_step[-LAST_STEPS:]
    assert result.metrics["train_loss_last"] == float(np.mean(every_step[-50:]))


@pytest.mark.parametrize(
    ("pipeline", "world_of_one", "world_size", "expected"),
    [
        (True, False, 1, False),  # the default in one process: nothing to overlap
        (True, True, 1, True),
        (True, False, 2, True),
        (True, False, 8, True),
        (False, False, 2, False),
        (False, True, 1, False),  # pipeline_world_of_one only widens trainer.pipeline
    ],
)
def test_use_pipeline(pipeline, world_of_one, world_size, expected):
    conf = to_config(
        compose_config(
            *TINY, f"trainer.pipeline={pipeline}", f"trainer.pipeline_world_of_one={world_of_one}"
        )
    )
    assert use_pipeline(conf.trainer, world_size) is expected


@pytest.mark.parametrize("bar", [False, pytest.param(True, marks=pytest.mark.slow)])
def test_without_the_progress_bar_the_log_says_each_log_step_and_evaluation(tmp_path, caplog, bar):
    """A reproduced gap: with ``trainer.progress_bar=false`` (a SLURM log) the console said
    nothing between the run directory and the final line: no training loss, no validation
    results (history.jsonl only). Now each log step and each evaluation is a line of the log,
    with the values history.jsonl records; with the bar, the bar shows the progress instead."""
    conf = to_config(
        compose_config(
            *TINY,
            "trainer.max_steps=4",
            "trainer.log_every=2",
            "trainer.eval_every=2",
            "trainer.eval_max_batches=1",
            f"trainer.progress_bar={bar}",
        )
    )
    rt = init_runtime("cpu")
    try:
        with caplog.at_level(logging.INFO, logger="dmt.trainer"):
            Trainer(conf, rt, tmp_path).fit()
    finally:
        close_runtime()
    said = [r.getMessage() for r in caplog.records if r.getMessage().startswith("step ")]
    history = [json.loads(line) for line in (tmp_path / "history.jsonl").read_text().splitlines()]
    expected = []
    for r in history:
        if "train/loss" in r:
            expected.append(
                f"step {r['step']}/4: train/loss {r['train/loss']:.4f}, "
                f"{r['train/samples_per_s']:.0f} samples/s"
            )
        else:
            split = "val" if "val/auc" in r else "test"
            values = ", ".join(
                f"{split}/{k} {r[f'{split}/{k}']:{'.0f' if k == 'num_samples' else '.4f'}}"
                for k in ("auc", "logloss", "ne", "calibration", "num_samples")
            )
            expected.append(f"step {r['step']}/4: {values}")
    assert len(history) == 5  # loss and validation at steps 2 and 4, the test at the end
    assert said == ([] if bar else expected)


def test_a_world_of_one_trains_with_the_plain_loop_unless_told_to_pipeline_it(tmp_path, caplog):
    """Default ``trainer.pipeline=true`` in one process: the plain loop, said in the log;
    ``trainer.pipeline_world_of_one=true``: TorchRec's pipelines, computing the same losses."""
    losses, kinds = {}, {}
    for forced in (False, True):
        conf = to_config(
            compose_config(
                *TINY,
                "trainer.max_steps=6",
                "trainer.eval_every=0",
                f"trainer.pipeline_world_of_one={forced}",
            )
        )
        rt = init_runtime("cpu")
        caplog.clear()
        try:
            with caplog.at_level(logging.INFO, logger="dmt.trainer"):
                trainer = Trainer(conf, rt, tmp_path / str(forced))
            kinds[forced] = (type(trainer.pipeline), type(trainer.eval_pipeline))
            said = "a world of one has no input distribution to overlap" in caplog.text
            assert said is not forced
            losses[forced] = trainer.fit(keep_losses=True).losses
        finally:
            close_runtime()
    assert kinds == {
        False: (type(None), type(None)),
        True: (TrainPipelineSparseDist, EvalPipelineSparseDist),
    }
    assert len(losses[False]) == 6 and losses[False] == losses[True]


@pytest.mark.parametrize(
    ("overrides", "warning"),
    [
        (
            ["trainer.pipeline=false", "trainer.pipeline_world_of_one=true"],
            "trainer.pipeline_world_of_one=true has no effect with trainer.pipeline=false: the "
            "plain loop trains at every world size",
        ),
        (
            ["trainer.checkpoint_async=true"],
            "trainer.checkpoint_async=true has no effect: this run writes no checkpoints "
            "(trainer.checkpoint=true writes one at the end, trainer.checkpoint_every=N every N "
            "steps)",
        ),
        (
            ["trainer.checkpoint_keep=2"],
            "trainer.checkpoint_keep=2 has no effect: this run writes no checkpoints "
            "(trainer.checkpoint=true writes one at the end, trainer.checkpoint_every=N every N "
            "steps)",
        ),
        (  # the LRs of a 4-step run: 1/8 .. 4/8 of the peaks
            ["trainer.max_steps=4", "optim.schedule.warmup_steps=8"],
            "optim.schedule.warmup_steps=8 is longer than the run (4 steps: trainer.epochs, "
            "trainer.max_steps): the LR never reaches its peak (optim.lr, optim.sparse_lr), 0.5 "
            "of it at the last step",
        ),
        (  # step 3's LR is the decay's first, the peak
            ["trainer.max_steps=4", "optim.schedule.decay_start=3", "optim.schedule.decay=linear"],
            "optim.schedule.decay=linear starts at step 3 (the later of decay_start=3 and "
            "warmup_steps=0), but the run's last step is 3 (4 steps: trainer.epochs, "
            "trainer.max_steps): the LR never decays",
        ),
        (  # TINY's run: 16 steps, none logged (history.jsonl had no training loss)
            ["trainer.log_every=20"],
            "trainer.log_every=20 is longer than the run (16 steps: trainer.epochs, "
            "trainer.max_steps): no training loss is logged (history.jsonl, wandb)",
        ),
        (  # reproduced: TINY's run trained its one epoch's 16 steps, not 40, without a word
            ["trainer.max_steps=40"],
            "trainer.max_steps=40 is longer than the run (16 steps: trainer.epochs, "
            "trainer.max_steps): trainer.epochs=1 ends it first (16 steps per epoch); "
            "trainer.epochs=3 trains 40 steps",
        ),
        (  # two epochs of 16 steps, and a max_steps past them
            ["trainer.max_steps=33", "trainer.epochs=2"],
            "trainer.max_steps=33 is longer than the run (32 steps: trainer.epochs, "
            "trainer.max_steps): trainer.epochs=2 ends it first (16 steps per epoch); "
            "trainer.epochs=3 trains 33 steps",
        ),
        (
            ["trainer.eval_every=20"],
            "trainer.eval_every=20 is longer than the run (16 steps: trainer.epochs, "
            "trainer.max_steps): validation runs only at the end",
        ),
        (  # the run ended without a checkpoint
            ["trainer.checkpoint_every=20"],
            "trainer.checkpoint_every=20 is longer than the run (16 steps: trainer.epochs, "
            "trainer.max_steps): the run writes no checkpoint (trainer.checkpoint=true writes one "
            "at the end)",
        ),
        (
            ["trainer.resume_allow_config_change=true"],
            "trainer.resume_allow_config_change=true has no effect without trainer.resume_from: "
            "the run starts fresh, and no checkpoint's config is compared with its own",
        ),
        (  # the flat run's losses, as without it
            ["sptt.sharding_type=column_wise"],
            "sptt.sharding_type='column_wise' is set, but "
            "sptt.enabled=false (flat TorchRec sharding) reads none of sptt.hosts_per_tower, "
            "sptt.local_world_size, sptt.sharding_type, sptt.peer_permute: sptt=on trains with "
            "them",
        ),
        (  # one process: the losses of fp32
            ["sptt.comm_precision=bf16"],
            "sptt.comm_precision=bf16 has no effect on a flat run (sptt.enabled=false) in a world "
            "of one: TorchRec's collectives of one rank send nothing, so no pooled embedding is "
            "rounded to bf16 (sptt=on rounds in its collectives at any world size)",
        ),
        (  # DLRM's losses, as without them
            ["model.dcn_num_layers=5"],
            "model.dcn_num_layers=5 is set, but this model has no CrossNet (interaction "
            "dmt.models.interaction.DotInteraction, tower module "
            "dmt.models.tower_modules.PassThrough): model.dcn_num_layers and model.dcn_low_rank "
            "size the DCN interaction (model=dcn) and DCN tower modules (tower=dcn)",
        ),
        (  # random data's losses, as without them
            [
                "data=synthetic_random",
                "data.synthetic.tie_prob=0.5",
                "data.synthetic.signal_scale=2",
            ],
            "data.synthetic.tie_prob=0.5, data.synthetic.signal_scale=2.0 are set, but "
            "data.synthetic.mode='random' reads none of data.synthetic.tie_prob, "
            "data.synthetic.signal_scale, data.synthetic.dense_scale (ids and labels are drawn "
            "independently, without a planted signal): data.synthetic.mode=planted plants one",
        ),
        (  # a CPU run: every table in host memory, as without it
            ["sharding.hbm_gb=4"],
            "sharding.hbm_gb=4.0 is set, but this run trains on CPU, which has no HBM and "
            "caches no table, and reads none of sharding.hbm_gb, sharding.uvm_cache_load_factor: "
            "every table lives in host memory, within sharding.ddr_gb (a CUDA run budgets its "
            "HBM with them)",
        ),
    ],
)
def test_settings_that_another_turns_off_are_warned_of(tmp_path, caplog, overrides, warning):
    """They were ignored without a word: the run looked as if they applied."""
    for given in (overrides, overrides[-1:] if len(overrides) > 1 else []):
        conf = to_config(
            compose_config(*TINY, "trainer.eval_every=0", "trainer.log_every=1", *given)
        )
        rt = init_runtime("cpu")
        caplog.clear()
        try:
            with caplog.at_level(logging.WARNING, logger="dmt.trainer"):
                Trainer(conf, rt, tmp_path / str(len(given)))
        finally:
            close_runtime()
        warned = [r.getMessage() for r in caplog.records if r.name == "dmt.trainer"]
        assert warned == ([warning] if given == overrides else []), given
