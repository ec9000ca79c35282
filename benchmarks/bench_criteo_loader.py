"""Is the Criteo loader the bottleneck? Training throughput on the Kaggle sample against the same
model on synthetic in-memory batches of the same shape (issue: Criteo pipeline, "loader must not be
the bottleneck"), side by side in one run.

    .venv/bin/python benchmarks/bench_criteo_loader.py --runs 3

Per run and mode it trains one epoch of ``experiment=criteo_sample_dlrm`` (or ``--experiment``)
on ``data=criteo_sample_holdout`` (93.5k training rows) and reads ``train_samples_per_s``:

- ``criteo_memory``: the preprocessed arrays read into RAM (the experiment's setting);
- ``criteo_mmap``: memory-mapped arrays, 64k-row shuffle windows, background prefetch (the
  streaming path the Terabyte set uses);
- ``synthetic``: dmt's random synthetic batches (``data=synthetic_random``) with the sample's
  table sizes, generated in memory before training.

It also times the loaders alone (batches per second without a model). Prints medians and the
ratios to ``synthetic``. Needs ``../shared/data/criteo-kaggle-sample/train.tsv`` (preprocessed on
first use into ``data_cache/``).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path
from tempfile import TemporaryDirectory

import torch

from dmt.data import build_data
from dmt.data.criteo_dataset import criteo_schema
from dmt.data.criteo_preprocess import preprocess_criteo, read_manifest
from dmt.train import compose_config, to_config, train

COMMON = ["logger=disabled", "trainer.progress_bar=false"]


def criteo_overrides(experiment: str, mmap: bool) -> list[str]:
    extra = ["data.criteo.in_memory=false", "data.criteo.shuffle_window_rows=65536"] if mmap else []
    return [*COMMON, f"experiment={experiment}", "data=criteo_sample_holdout", *extra]


def synthetic_overrides(experiment: str, cardinalities: list[int], rows: int) -> list[str]:
    cards = "[" + ",".join(str(c) for c in cardinalities) + "]"
    return [
        *COMMON,
        f"experiment={experiment}",
        "data=synthetic_random",
        f"data.synthetic.cardinalities={cards}",
        f"data.synthetic.num_train={rows}",
        "data.synthetic.num_val=2048",
        "data.synthetic.num_test=2048",
        "data.batch_size=512",
    ]


def train_rate(overrides: list[str]) -> float:
    with TemporaryDirectory() as out:
        return float(train(compose_config(*overrides), Path(out))["train_samples_per_s"])


def loader_rate(overrides: list[str]) -> float:
    """Training batches per second of the loader alone (one epoch, no model)."""
    data = build_data(to_config(compose_config(*overrides)).data, seed=0)
    tick = time.perf_counter()
    batches = sum(1 for _ in data.train.batches(0))
    return batches / (time.perf_counter() - tick)


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--experiment", default="criteo_sample_dlrm")
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)

    memory = criteo_overrides(args.experiment, mmap=False)
    data_cfg = to_config(compose_config(*memory)).data
    preprocess_criteo(data_cfg.criteo, progress=False)  # a no-op once data_cache/ is up to date
    _, cardinalities, _ = criteo_schema(data_cfg)
    rows = read_manifest(data_cfg.criteo.preprocessed_dir)["splits"]["train"]["rows"] // 512 * 512
    modes = {
        "criteo_memory": memory,
        "criteo_mmap": criteo_overrides(args.experiment, mmap=True),
        "synthetic": synthetic_overrides(args.experiment, list(cardinalities), rows),
    }
    rates: dict[str, list[float]] = {m: [] for m in modes}
    loaders: dict[str, list[float]] = {m: [] for m in modes}
    for run in range(args.runs):
        for mode, overrides in modes.items():  # interleaved, so drift hits every mode alike
            rates[mode].append(train_rate(overrides))
            loaders[mode].append(loader_rate(overrides))
            print(
                f"run {run} {mode:14s} train {rates[mode][-1]:9.0f} samples/s   "
                f"loader alone {loaders[mode][-1] * 512:10.0f} samples/s",
                flush=True,
            )
    base = statistics.median(rates["synthetic"])
    summary = {}
    print(
        f"\nmedian of {args.runs} runs, {args.experiment}, batch 512, {torch.get_num_threads()} threads"
    )
    for mode in modes:
        train_median = statistics.median(rates[mode])
        loader_median = statistics.median(loaders[mode]) * 512
        summary[mode] = {
            "train_samples_per_s": train_median,
            "loader_samples_per_s": loader_median,
            "ratio_to_synthetic": train_median / base,
        }
        print(
            f"{mode:14s} train {train_median:9.0f} samples/s  ({train_median / base:.2f}x synthetic)"
            f"   loader alone {loader_median:10.0f} samples/s ({loader_median / train_median:.1f}x training)"
        )
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
