"""``trainer.ema_decay`` in the training loop (single process, TorchRec DMP on gloo): the
average follows the dense weights step by step, evaluation reads it, training does not."""

from __future__ import annotations

import itertools

import pytest
import torch

from dmt import checkpoint
from dmt.runtime import close_runtime, init_runtime
from dmt.train import to_config
from dmt.trainer import Trainer, dense_parameters
from tests.conftest import compose_config
from tests.integration.test_train import TINY

STEPS = 5
DECAY = 0.7


def _trainer(tmp_path, *overrides: str) -> Trainer:
    conf = to_config(compose_config(*TINY, f"trainer.max_steps={STEPS}", *overrides))
    return Trainer(conf, init_runtime("cpu"), tmp_path)


@pytest.mark.parametrize("pipeline", [True, False], ids=["pipelined", "plain"])
def test_evaluation_reads_the_hand_computed_ema_and_training_the_raw_weights(tmp_path, pipeline):
    try:
        trainer = _trainer(
            tmp_path,
            f"trainer.pipeline={pipeline}",
            "trainer.pipeline_world_of_one=true",
            f"trainer.ema_decay={DECAY}",
        )
        assert (trainer.pipeline is not None) == pipeline
        params = [p for _, p in dense_parameters(trainer.model)]
        seen = []  # the dense weights after every step
        batches = itertools.islice(trainer.data.train.batches(0), STEPS)
        for _ in trainer.run_steps(batches):
            seen.append([p.detach().clone() for p in params])
        assert len(seen) == STEPS and trainer.ema is not None
        expected = seen[0]
        for weights in seen[1:]:
            expected = [DECAY * e + (1 - DECAY) * w for e, w in zip(expected, weights)]
        for avg, exp in zip(trainer.ema.averages, expected):
            torch.testing.assert_close(avg, exp, rtol=1e-6, atol=1e-7)

        with_ema = trainer.evaluate(trainer.data.val)
        assert all(torch.equal(p, w) for p, w in zip(params, seen[-1]))  # raw weights back
        again = trainer.evaluate(trainer.data.val)  # the same averages over the same raw weights
        trainer.ema = None
        without = trainer.evaluate(trainer.data.val)
        with torch.no_grad():  # a model loaded with the hand-computed averages
            for p, e in zip(params, expected):
                p.copy_(e)
        loaded = trainer.evaluate(trainer.data.val)
    finally:
        close_runtime()
    assert again == with_ema
    assert loaded == pytest.approx(with_ema, rel=1e-5, abs=1e-6)
    assert without["auc"] != with_ema["auc"]


def test_ema_leaves_training_unchanged(tmp_path):
    """Same losses and weights with the EMA on as off; only the evaluated metrics differ."""
    runs = {}
    for ema in (None, DECAY):
        try:
            trainer = _trainer(tmp_path / str(ema), f"trainer.ema_decay={ema or 'null'}")
            result = trainer.fit(keep_losses=True)
            weights = [p.detach().clone() for _, p in dense_parameters(trainer.model)]
        finally:
            close_runtime()
        runs[ema] = result, weights
    (off, w_off), (on, w_on) = runs[None], runs[DECAY]
    assert on.losses == off.losses
    assert all(torch.equal(a, b) for a, b in zip(w_on, w_off))
    assert on.metrics["val_auc"] != off.metrics["val_auc"]


def _fit(tmp_path, *overrides: str) -> tuple[dict[str, float], dict[str, torch.Tensor]]:
    """A run's metrics and its EMA's averages by name."""
    try:
        trainer = _trainer(tmp_path, f"trainer.ema_decay={DECAY}", *overrides)
        metrics = trainer.fit().metrics
        assert trainer.ema is not None
        averages = {n: a.clone() for n, a in zip(trainer.ema.names, trainer.ema.averages)}
        raw = {n: p.detach().clone() for n, p in dense_parameters(trainer.model)}
    finally:
        close_runtime()
    return metrics, averages, raw


def test_checkpoints_hold_the_average_a_resume_continues_and_dmt_eval_reads(tmp_path):
    full, averages, raw = _fit(
        tmp_path / "full", "trainer.max_steps=8", "trainer.checkpoint_every=4"
    )
    ckpt = tmp_path / "full" / "checkpoints"
    resumed, resumed_averages, _ = _fit(
        tmp_path / "resumed", "trainer.max_steps=8", f"trainer.resume_from={ckpt / 'step_4'}"
    )
    for key in ("val_auc", "val_logloss", "test_auc", "test_logloss"):
        assert resumed[key] == full[key], key
    assert resumed_averages.keys() == averages.keys()
    for name in averages:
        torch.testing.assert_close(resumed_averages[name], averages[name], rtol=0, atol=0)

    # dmt-eval's weights: the averages in the dense weights' place; ema=False: the raw ones
    state = checkpoint.load_model_state(ckpt / "step_8")
    plain = checkpoint.load_model_state(ckpt / "step_8", ema=False)
    assert state.keys() == plain.keys()
    for name in averages:  # the training module's state-dict keys
        torch.testing.assert_close(state[name], averages[name], rtol=0, atol=0)
        torch.testing.assert_close(plain[name], raw[name], rtol=0, atol=0)
    tables = [k for k in state if "embedding_bags" in k]
    assert tables and all(torch.equal(state[k], plain[k]) for k in tables)


def test_resuming_a_run_without_an_average_starts_one(tmp_path, caplog):
    try:
        _trainer(tmp_path / "a", "trainer.max_steps=4", "trainer.checkpoint=true").fit()
    finally:
        close_runtime()
    ckpt = tmp_path / "a" / "checkpoints" / "step_4"
    try:
        trainer = _trainer(
            tmp_path / "b",
            "trainer.max_steps=6",
            f"trainer.ema_decay={DECAY}",
            f"trainer.resume_from={ckpt}",
        )
        trainer.fit()
    finally:
        close_runtime()
    assert trainer.ema is not None and trainer.ema.num_updates == 2  # steps 5 and 6
    assert f"checkpoint {ckpt} holds no moving average of the weights" in caplog.text
