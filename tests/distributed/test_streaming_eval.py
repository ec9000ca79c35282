"""Streaming evaluation across ranks (dmt/metrics.py ``StreamingClickMetrics``, ``Trainer.evaluate``).

Each rank sums its own predictions; one ``all_reduce`` of a fixed-size state gives every rank the
metrics of all of them, equal to the exact single-process metrics (AUC within 1e-4). The
collectives are counted by wrapping ``torch.distributed``'s functions inside the test's worker
processes only: the wrappers call the real functions.
"""

from __future__ import annotations

import functools
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
import torch.distributed as dist

from dmt.data import InMemorySource
from dmt.metrics import StreamingClickMetrics, click_metrics
from dmt.runtime import Runtime
from dmt.train import to_config
from dmt.trainer import Trainer
from tests.conftest import compose_config
from tests.distributed.distributed_harness import backends, run_on_ranks

COUNTED = (
    "all_reduce",
    "all_gather",
    "all_gather_into_tensor",
    "all_gather_object",
    "gather",
    "gather_object",
    "broadcast",
    "broadcast_object_list",
    "reduce",
    "reduce_scatter",
    "reduce_scatter_tensor",
    "all_to_all",
    "all_to_all_single",
    "barrier",
)
METRICS = ("auc", "logloss", "ne", "calibration", "num_samples")


@contextmanager
def counting_collectives() -> Iterator[list[tuple[str, int]]]:
    """Records ``(name, bytes of its first tensor argument)`` of every collective called."""
    calls: list[tuple[str, int]] = []
    originals = {name: getattr(dist, name) for name in COUNTED if hasattr(dist, name)}

    def wrap(name: str, fn: Any) -> Any:
        @functools.wraps(fn)
        def counted(*args: Any, **kwargs: Any) -> Any:
            first = args[0] if args else next(iter(kwargs.values()), None)
            calls.append((name, first.nbytes if isinstance(first, torch.Tensor) else -1))
            return fn(*args, **kwargs)

        return counted

    for name, fn in originals.items():
        setattr(dist, name, wrap(name, fn))
    try:
        yield calls
    finally:
        for name, fn in originals.items():
            setattr(dist, name, fn)


def _global_scores(n: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(7)
    y = rng.random(n) < 0.03
    p = 1 / (1 + np.exp(-(-3.5 + rng.standard_normal(n) + 1.2 * y)))
    return p.astype(np.float32), y.astype(np.float32)


def _sync_worker(rank: int, world_size: int, sizes: list[int]) -> tuple[dict, list]:
    p, y = _global_scores(sum(sizes))
    lo = sum(sizes[:rank])
    mine = slice(lo, lo + sizes[rank])
    acc = StreamingClickMetrics()
    for chunk in np.array_split(np.arange(mine.start, mine.stop), 3):
        acc.update(torch.from_numpy(p[chunk]), torch.from_numpy(y[chunk]))
    with counting_collectives() as calls:
        metrics = acc.sync().compute()
    return metrics, calls


@pytest.mark.parametrize("sizes", [[30_000, 1_237], [20_000, 0, 7_001, 3]], ids=["2", "4"])
def test_synced_metrics_equal_the_exact_ones(sizes: list[int]) -> None:
    results = run_on_ranks(_sync_worker, len(sizes), sizes, timeout_s=60)
    p, y = _global_scores(sum(sizes))
    exact = click_metrics(torch.from_numpy(p), torch.from_numpy(y))
    state_bytes = StreamingClickMetrics().state.nbytes
    for metrics, calls in results:
        assert metrics == results[0][0]  # every rank holds the same numbers
        assert calls == [("all_reduce", state_bytes)]
        assert metrics["auc"] == pytest.approx(exact["auc"], abs=1e-4)
        for k in ("logloss", "ne", "calibration"):
            assert metrics[k] == pytest.approx(exact[k], rel=1e-12), k
        assert metrics["num_samples"] == sum(sizes)


TINY = [
    "logger=disabled",
    "trainer.progress_bar=false",
    "data.synthetic.num_train=2048",
    "data.synthetic.num_val=1400",
    "data.synthetic.num_test=256",
    "data.batch_size=256",
    "data.eval_batch_size=256",  # each rank's last validation batch is partial
    "trainer.max_steps=6",
    "trainer.eval_max_batches=-1",
    "model.embedding_dim=8",
    "model.bottom_mlp=[16,8]",
    "model.top_mlp=[16,1]",
]


@torch.no_grad()
def _gathered_predictions(
    trainer: Trainer, source: InMemorySource | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """The reference: the plain loop's predictions of ``source`` (default: the validation split)
    on every rank, gathered to every rank (as evaluation once did)."""
    trainer.model.eval()
    probs, labels = [], []
    for batch in (trainer.data.val if source is None else source).batches(0):
        assert batch.labels.numel() > 0  # the reference needs no padding
        _, logits = trainer.model(batch.to(trainer.rt.device))
        probs.append(torch.sigmoid(logits).cpu())
        labels.append(batch.labels)
    trainer.model.train()
    gathered: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, (torch.cat(probs), torch.cat(labels)))
    return torch.cat([g[0] for g in gathered]), torch.cat([g[1] for g in gathered])


def _trainer_worker(rank: int, world_size: int, out: str) -> dict[str, Any]:
    torch.manual_seed(0)
    rt = Runtime(rank, world_size, rank, world_size, torch.device("cpu"), "gloo")
    trainer = Trainer(to_config(compose_config(*TINY)), rt, Path(out))
    trainer.fit()
    with counting_collectives() as eval_calls:
        metrics = trainer.evaluate(trainer.data.val)
    with counting_collectives() as oracle_calls:
        oracle = trainer.oracle_auc(trainer.data.val)
    probs, labels = _gathered_predictions(trainer)
    truth: list[Any] = [None] * world_size
    dist.all_gather_object(truth, trainer.data.val.local_true_probs())
    return {
        "metrics": metrics,
        "exact": click_metrics(probs, labels),
        "oracle": oracle,
        "oracle_exact": click_metrics(torch.from_numpy(np.concatenate(truth)), labels)["auc"],
        "eval_calls": eval_calls,
        "oracle_calls": oracle_calls,
    }


def test_trainer_evaluate_streams_with_one_small_all_reduce(tmp_path: Path) -> None:
    results = run_on_ranks(_trainer_worker, 2, str(tmp_path), timeout_s=240)
    state_bytes = StreamingClickMetrics().state.nbytes
    for r in results:
        assert list(r["metrics"]) == list(METRICS)
        assert r["metrics"] == results[0]["metrics"]
        assert r["metrics"]["num_samples"] == 1400 == r["exact"]["num_samples"]
        assert r["metrics"]["auc"] == pytest.approx(r["exact"]["auc"], abs=1e-4)
        for k in ("logloss", "ne", "calibration"):
            assert r["metrics"][k] == pytest.approx(r["exact"][k], rel=1e-12), k
        assert r["oracle"] == pytest.approx(r["oracle_exact"], abs=1e-4)
        # no prediction leaves its rank: one all_reduce of the fixed-size state; the model's
        # own forward collectives (TorchRec's all-to-alls) are all that is left
        for calls in (r["eval_calls"], r["oracle_calls"]):
            names = [name for name, _ in calls]
            assert not {"all_gather_object", "all_gather", "gather_object"} & set(names), names
            assert [c for c in calls if c[0] == "all_reduce"] == [("all_reduce", state_bytes)]
        assert r["oracle_calls"] == [("all_reduce", state_bytes)]


def _short_last_batch_worker(
    rank: int, world_size: int, out: str, backend: str, overrides: list[str]
) -> dict[str, Any]:
    torch.manual_seed(0)
    device = torch.device("cuda", rank) if backend == "nccl" else torch.device("cpu")
    rt = Runtime(rank, world_size, rank, world_size, device, backend)
    cfg = to_config(compose_config(*TINY, *overrides))
    trainer = Trainer(cfg, rt, Path(out))
    trainer.fit()
    seen: list[int] = []  # the rows of every batch the model is run on, padding included
    hook = trainer.model.register_forward_pre_hook(
        lambda _, args: seen.append(args[0].dense_features.shape[0])
    )
    try:
        metrics = trainer.evaluate(trainer.data.val)
    finally:
        hook.remove()
    val = trainer.data.val
    assert isinstance(val, InMemorySource)
    shares = [b.labels.numel() for b in val.batches(0)]
    # the reference: the same rows in global batches of 257, whose last one (255 rows) leaves
    # no rank empty
    same_rows = InMemorySource(
        val.dense,
        val.sparse,
        val.labels,
        val.feature_names,
        batch_size=257,
        rank=rank,
        world_size=world_size,
    )
    probs, labels = _gathered_predictions(trainer, same_rows)
    return {
        "metrics": metrics,
        "exact": click_metrics(probs, labels),
        "seen": seen,
        "shares": shares,
        "pipelined": trainer.eval_pipeline is not None,
    }


@pytest.mark.parametrize("backend", backends(min_gpus=4))
@pytest.mark.parametrize(
    "overrides",
    [[], ["trainer.pipeline=false"], ["model=dcn", "model.dcn_low_rank=4"]],
    ids=["pipelined", "plain", "dcn"],
)
def test_no_rank_evaluates_an_empty_batch(
    tmp_path: Path, backend: str, overrides: list[str]
) -> None:
    """1026 validation rows in global batches of 256 on 4 ranks: the last global batch has 2 rows,
    so ranks 2 and 3 hold none of it. They run the model on one padding row (a zero-row batch
    fails FBGEMM's CUDA bucketizing of row-wise shards), and the metrics are those of the 1026
    rows."""
    results = run_on_ranks(
        _short_last_batch_worker,
        4,
        str(tmp_path),
        backend,
        ["data.synthetic.num_val=1026", *overrides],
        timeout_s=240,
        backend=backend,
    )
    for rank, r in enumerate(results):
        assert r["pipelined"] == ("trainer.pipeline=false" not in overrides)
        assert r["shares"][-1] == (1 if rank < 2 else 0)
        assert r["seen"] == [max(n, 1) for n in r["shares"]]
        assert r["metrics"] == results[0]["metrics"]
        assert r["metrics"]["num_samples"] == 1026 == r["exact"]["num_samples"]
        assert r["metrics"]["auc"] == pytest.approx(r["exact"]["auc"], abs=1e-4)
        for k in ("logloss", "ne", "calibration"):
            assert r["metrics"][k] == pytest.approx(r["exact"][k], rel=1e-6), k
