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
  table sizes, generated in memory before training, with the batch size the experiment composes
  on ``data=criteo_sample_holdout`` (``data.batch_size``) and as many training rows as the
  sample's training split, rounded down to whole batches.

It also times the loaders alone (samples per second of one epoch without a model). The modes'
order rotates from run to run (run ``i`` starts with mode ``i mod 3``), so drift and warm caches
hit every mode alike. Prints per mode the median of each figure with its range (min-max) over the
runs, the ratios of the medians to ``synthetic`` and the machine's load (``os.getloadavg()``)
before and after; the last line is the summary as JSON. Needs
``../shared/data/criteo-kaggle-sample/train.tsv`` (preprocessed on first use into
``data_cache/``).

``--runs`` must be at least 3 (a median of fewer runs is not a result); ``--smoke`` allows 1 or
2 runs to check that the script runs, says loudly that its figures are not a result and marks
the JSON summary ``"smoke": true``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from tempfile import TemporaryDirectory

import torch

from dmt.data import build_data
from dmt.data.criteo_dataset import criteo_schema
from dmt.data.criteo_preprocess import preprocess_criteo, read_manifest
from dmt.results import add_runs_options, check_runs, compose_or_exit, load_average
from dmt.train import compose_config, to_config, train

COMMON = ["logger=disabled", "trainer.progress_bar=false"]


def criteo_overrides(experiment: str, mmap: bool) -> list[str]:
    extra = ["data.criteo.in_memory=false", "data.criteo.shuffle_window_rows=65536"] if mmap else []
    return [*COMMON, f"experiment={experiment}", "data=criteo_sample_holdout", *extra]


def synthetic_overrides(
    experiment: str, cardinalities: list[int], rows: int, batch_size: int
) -> list[str]:
    cards = "[" + ",".join(str(c) for c in cardinalities) + "]"
    return [
        *COMMON,
        f"experiment={experiment}",
        "data=synthetic_random",
        f"data.synthetic.cardinalities={cards}",
        f"data.synthetic.num_train={rows}",
        "data.synthetic.num_val=2048",
        "data.synthetic.num_test=2048",
        f"data.batch_size={batch_size}",
    ]


def train_rate(overrides: list[str]) -> float:
    with TemporaryDirectory() as out:
        return float(train(compose_config(*overrides), Path(out))["train_samples_per_s"])


def loader_rate(overrides: list[str]) -> float:
    """Training samples per second of the loader alone (one epoch, no model)."""
    data = build_data(to_config(compose_config(*overrides)).data, seed=0)
    tick = time.perf_counter()
    samples = sum(int(b.labels.shape[0]) for b in data.train.batches(0))
    return samples / (time.perf_counter() - tick)


def _range(values: list[float]) -> str:
    return f"{min(values):,.0f}-{max(values):,.0f}"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    add_runs_options(ap, "runs of every mode")
    ap.add_argument("--experiment", default="criteo_sample_dlrm")
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    args = ap.parse_args(argv)
    check_runs(ap, args.runs, args.smoke)
    if args.threads < 0:
        ap.error(f"--threads {args.threads}: must be 0 (torch's default) or more")
    if args.threads:
        torch.set_num_threads(args.threads)

    memory = criteo_overrides(args.experiment, mmap=False)
    given = {f"experiment={args.experiment}": f"--experiment {args.experiment}"}
    data_cfg = compose_or_exit(ap, memory, given).data
    preprocess_criteo(data_cfg.criteo, progress=False)  # a no-op once data_cache/ is up to date
    _, cardinalities, _ = criteo_schema(data_cfg)
    batch = data_cfg.batch_size  # the experiment's, as the criteo modes train with it
    split_rows = read_manifest(data_cfg.criteo.preprocessed_dir)["splits"]["train"]["rows"]
    rows = split_rows // batch * batch
    if rows == 0:
        ap.error(
            f"--experiment {args.experiment}: data.batch_size {batch} is larger than the "
            f"sample's {split_rows} training rows"
        )
    modes = {
        "criteo_memory": memory,
        "criteo_mmap": criteo_overrides(args.experiment, mmap=True),
        "synthetic": synthetic_overrides(args.experiment, list(cardinalities), rows, batch),
    }
    names = list(modes)
    rates: dict[str, list[float]] = {m: [] for m in modes}
    loaders: dict[str, list[float]] = {m: [] for m in modes}
    load_start = load_average()
    print(f"load average before: {load_start}; batch {batch}", flush=True)
    for run in range(args.runs):
        k = run % len(names)
        for mode in names[k:] + names[:k]:  # interleaved, rotating which goes first
            overrides = modes[mode]
            rates[mode].append(train_rate(overrides))
            loaders[mode].append(loader_rate(overrides))
            print(
                f"run {run} {mode:14s} train {rates[mode][-1]:9.0f} samples/s   "
                f"loader alone {loaders[mode][-1]:10.0f} samples/s",
                flush=True,
            )
    load_end = load_average()
    base = statistics.median(rates["synthetic"])
    summary: dict[str, object] = {
        "experiment": args.experiment,
        "batch_size": batch,
        "runs": args.runs,
        "smoke": args.smoke,
        "threads": torch.get_num_threads(),
        "load_avg_start": [float(x) for x in load_start.split()],
        "load_avg_end": [float(x) for x in load_end.split()],
    }
    print(
        f"\nmedian (range) of {args.runs} runs, {args.experiment}, batch {batch}, "
        f"{torch.get_num_threads()} threads; load average before {load_start}, after {load_end}"
    )
    for mode in modes:
        train_median = statistics.median(rates[mode])
        loader_median = statistics.median(loaders[mode])
        summary[mode] = {
            "train_samples_per_s": train_median,
            "train_samples_per_s_min": min(rates[mode]),
            "train_samples_per_s_max": max(rates[mode]),
            "loader_samples_per_s": loader_median,
            "loader_samples_per_s_min": min(loaders[mode]),
            "loader_samples_per_s_max": max(loaders[mode]),
            "ratio_to_synthetic": train_median / base,
        }
        print(
            f"{mode:14s} train {train_median:9.0f} samples/s ({_range(rates[mode])}, "
            f"{train_median / base:.2f}x synthetic)   loader alone {loader_median:10.0f} "
            f"samples/s ({_range(loaders[mode])}, {loader_median / train_median:.1f}x training)"
        )
    print(json.dumps(summary))
    if args.smoke:
        print("WARNING: --smoke run: not a result", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
