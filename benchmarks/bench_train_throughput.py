"""Training throughput: dmt (TorchRec DMP, FBGEMM's fused row-wise Adagrad on the tables) vs the
strongest plain PyTorch loop we know of for the same model, data and optimizer settings.

    .venv/bin/python benchmarks/bench_train_throughput.py --runs 3

Model: DLRM, 26 tables x 100k rows, dim 64, bottom 512-256-64, top 512-256-1, batch 2048,
``optim=adagrad`` (tables: lr ``optim.sparse_lr``, eps 1e-8; dense: ``torch.optim.Adagrad``, lr
``optim.lr``). One process on the CPU (a world of one).

The plain side: ``nn.EmbeddingBag(mode="sum", sparse=True)`` tables, so a step's embedding
gradients hold only the rows its batch looked up, updated by ``torch.optim.Adagrad`` (which takes
sparse gradients: it touches only those rows), plus the dense optimizer dmt builds from the same
config (:func:`dmt.optim.dense_optimizer`) over the MLPs. What still differs, as close as plain
PyTorch gets:

* torch has no row-wise Adagrad: the plain side keeps one Adagrad sum per element (26 x 100k x 64
  floats) where dmt keeps one per row (26 x 100k), so its update reads and writes 64x the state
  (a hand-written row-wise update would be closer, but is no longer torch's optimizer);
* dmt updates the tables inside the backward (FBGEMM's fused kernel); the plain side builds sparse
  COO gradients, then ``optimizer.step()`` coalesces and applies them;
* dmt's step also runs its LR scheduler (constant here) and counts the step.

Each run times both sides, alternating which goes first from run to run (``--warmup`` untimed
steps, then ``--steps`` timed, each on a fresh model). Prints samples/s per run, the median of each
side with its range (min-max) over the runs, the ratio of the medians and the machine's load
(``os.getloadavg()``) before and after.

``--runs`` must be at least 3 (a median of fewer runs is not a result); ``--smoke`` allows 1 or
2 runs to check that the script runs, and says loudly that its figures are not a result.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from tempfile import TemporaryDirectory

import torch

from dmt.config import ModelConfig
from dmt.data import build_data
from dmt.models import build_model
from dmt.optim import dense_optimizer, sparse_optimizer_spec
from dmt.results import add_runs_options, check_runs, load_average
from dmt.runtime import close_runtime, init_runtime
from dmt.train import compose_config, to_config
from dmt.trainer import Trainer

BATCH = 2048
OVERRIDES = [
    "logger=disabled",
    "trainer.progress_bar=false",
    "data=synthetic_random",
    "data.synthetic.cardinality=100000",
    "data.synthetic.num_val=2048",
    "data.synthetic.num_test=2048",
    f"data.batch_size={BATCH}",
    "model.embedding_dim=64",
    "model.bottom_mlp=[512,256,64]",
    "model.top_mlp=[512,256,1]",
    "optim=adagrad",
]


def _config(steps: int, warmup: int):
    return to_config(
        compose_config(*OVERRIDES, f"data.synthetic.num_train={BATCH * (steps + warmup)}")
    )


def dmt_run(steps: int, warmup: int) -> float:
    """Samples/s of dmt's training step (``Trainer.train_step``) over ``steps`` timed steps."""
    conf = _config(steps, warmup)
    rt = init_runtime("cpu")
    try:
        with TemporaryDirectory() as out:
            trainer = Trainer(conf, rt, Path(out))
            batches = list(trainer.data.train.batches(0))
            for b in batches[:warmup]:
                trainer.train_step(b)
            t0 = time.perf_counter()
            for b in batches[warmup:]:
                trainer.train_step(b)
            return BATCH * steps / (time.perf_counter() - t0)
    finally:
        close_runtime()


def plain_run(steps: int, warmup: int) -> float:
    """Samples/s of the plain PyTorch loop (sparse embedding gradients, ``torch.optim.Adagrad``
    on them, dmt's dense optimizer on the rest) over ``steps`` timed steps."""
    conf = _config(steps, warmup)
    data = build_data(conf.data, seed=0)
    torch.manual_seed(0)
    m: ModelConfig = conf.model
    ref = build_model(
        m, feature_names=data.feature_names, cardinalities=data.cardinalities, num_dense=13
    )
    tables = torch.nn.ModuleList(
        torch.nn.EmbeddingBag(c, m.embedding_dim, mode="sum", include_last_offset=True, sparse=True)
        for c in data.cardinalities
    )
    cls, sparse_kwargs = sparse_optimizer_spec(conf.optim)  # RowWiseAdagrad(lr, eps)
    assert cls.__name__ == "RowWiseAdagrad", cls
    sparse_opt = torch.optim.Adagrad(
        tables.parameters(), lr=sparse_kwargs["lr"], eps=sparse_kwargs.get("eps", 1e-10)
    )
    dense_opt = dense_optimizer(
        [p for n, p in ref.named_parameters() if "embedding" not in n], conf.optim
    )
    batches = list(data.train.batches(0))

    def step(b) -> None:
        kjt = b.sparse_features
        pooled = torch.stack(
            [
                t(kjt[name].values(), kjt[name].offsets())
                for t, name in zip(tables, data.feature_names)
            ],
            1,
        )
        loss = torch.nn.functional.binary_cross_entropy_with_logits(
            ref.dense_forward(b.dense_features, pooled), b.labels
        )
        sparse_opt.zero_grad()
        dense_opt.zero_grad()
        loss.backward()
        sparse_opt.step()
        dense_opt.step()

    for b in batches[:warmup]:
        step(b)
    t0 = time.perf_counter()
    for b in batches[warmup:]:
        step(b)
    return BATCH * steps / (time.perf_counter() - t0)


SIDES: dict[str, Callable[[int, int], float]] = {"dmt": dmt_run, "plain": plain_run}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    add_runs_options(ap, "runs of each side")
    ap.add_argument("--steps", type=int, default=30, help="timed steps per run and side")
    ap.add_argument("--warmup", type=int, default=5, help="untimed steps first")
    args = ap.parse_args(argv)
    check_runs(ap, args.runs, args.smoke)
    if args.steps < 1:
        ap.error(f"--steps {args.steps}: must be at least 1")
    if args.warmup < 0:
        ap.error(f"--warmup {args.warmup}: must be 0 or more")
    warnings.filterwarnings("ignore", message="Sparse invariant checks are implicitly disabled")

    load_start = load_average()
    print(f"load average before: {load_start}", flush=True)
    rates: dict[str, list[float]] = {side: [] for side in SIDES}
    for r in range(args.runs):
        order = list(SIDES) if r % 2 == 0 else list(reversed(SIDES))
        for side in order:
            rates[side].append(SIDES[side](args.steps, args.warmup))
        print(
            f"run {r} ({' then '.join(order)}): dmt {rates['dmt'][-1]:,.0f} samples/s   "
            f"plain PyTorch {rates['plain'][-1]:,.0f} samples/s",
            flush=True,
        )
    load_end = load_average()
    med = {side: statistics.median(v) for side, v in rates.items()}
    print(
        f"\nmedian of {args.runs} runs, {args.steps} steps of batch {BATCH} each, "
        f"{torch.get_num_threads()} threads; load average before {load_start}, after {load_end}"
    )
    for side, values in rates.items():
        print(
            f"  {side:5s} median {med[side]:>10,.0f} samples/s "
            f"(range {min(values):,.0f}-{max(values):,.0f})"
        )
    print(f"  dmt / plain: {med['dmt'] / med['plain']:.2f}x (ratio of the medians)")
    if args.smoke:
        print("WARNING: --smoke run: not a result", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
