"""Training throughput: dmt (TorchRec DMP, fused FBGEMM row-wise Adagrad) vs a plain PyTorch loop
(``nn.EmbeddingBag`` tables + ``torch.optim.Adagrad`` over every parameter), same model and data.

    .venv/bin/python benchmarks/bench_train_throughput.py --runs 3

Model: DLRM, 26 tables x 100k rows, dim 64, bottom 512-256-64, top 512-256-1, batch 2048.
Prints samples/s per run, medians and the ratio.
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path
from tempfile import TemporaryDirectory

import torch

from dmt.config import ModelConfig
from dmt.data import build_data
from dmt.models import build_model
from dmt.runtime import close_runtime, init_runtime
from dmt.train import compose_config, to_config
from dmt.trainer import Trainer

OVERRIDES = [
    "logger=disabled",
    "trainer.progress_bar=false",
    "data=synthetic_random",
    "data.synthetic.cardinality=100000",
    "data.synthetic.num_val=2048",
    "data.synthetic.num_test=2048",
    "data.batch_size=2048",
    "model.embedding_dim=64",
    "model.bottom_mlp=[512,256,64]",
    "model.top_mlp=[512,256,1]",
    "optim=adagrad",
]


def dmt_run(steps: int, warmup: int) -> float:
    conf = to_config(
        compose_config(*OVERRIDES, f"data.synthetic.num_train={2048 * (steps + warmup)}")
    )
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
            return 2048 * steps / (time.perf_counter() - t0)
    finally:
        close_runtime()


def plain_run(steps: int, warmup: int) -> float:
    conf = to_config(
        compose_config(*OVERRIDES, f"data.synthetic.num_train={2048 * (steps + warmup)}")
    )
    data = build_data(conf.data, seed=0)
    torch.manual_seed(0)
    m: ModelConfig = conf.model
    ref = build_model(
        m, feature_names=data.feature_names, cardinalities=data.cardinalities, num_dense=13
    )
    tables = torch.nn.ModuleList(
        torch.nn.EmbeddingBag(c, m.embedding_dim, mode="sum", include_last_offset=True)
        for c in data.cardinalities
    )
    params = list(tables.parameters()) + [
        p for n, p in ref.named_parameters() if "embedding" not in n
    ]
    opt = torch.optim.Adagrad(params, lr=conf.optim.lr)
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
        opt.zero_grad()
        loss.backward()
        opt.step()

    for b in batches[:warmup]:
        step(b)
    t0 = time.perf_counter()
    for b in batches[warmup:]:
        step(b)
    return 2048 * steps / (time.perf_counter() - t0)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--warmup", type=int, default=5)
    args = ap.parse_args()
    dmt_s, plain_s = [], []
    for r in range(args.runs):
        dmt_s.append(dmt_run(args.steps, args.warmup))
        plain_s.append(plain_run(args.steps, args.warmup))
        print(
            f"run {r}: dmt {dmt_s[-1]:,.0f} samples/s   plain PyTorch {plain_s[-1]:,.0f} samples/s",
            flush=True,
        )
    md, mp = statistics.median(dmt_s), statistics.median(plain_s)
    print(f"median: dmt {md:,.0f} samples/s, plain {mp:,.0f} samples/s, ratio {md / mp:.2f}x")


if __name__ == "__main__":
    main()
