"""Checkpoint save time and size: the DCP format (``dmt.checkpoint.Checkpointer``, synchronous and
asynchronous) vs the format dmt used before (one ``torch.save`` per rank, git commit 6d8a42d).

    .venv/bin/python benchmarks/bench_checkpoint.py --runs 3 [--json FILE] [OVERRIDE ...]

Model and data: the ``dmt-train`` defaults (DLRM on planted synthetic data, dmt/conf/config.yaml) plus
any Hydra overrides given; one process (world of one, gloo on CPU), a few training steps first so
the optimizer state exists. Each save goes to a fresh directory; the methods alternate within a
run (their order rotates from run to run). Measured:

* ``new sync``: ``Checkpointer(async_save=False).save(...)`` (DCP files, fsync, ``meta.json``);
* ``new async save()``: ``Checkpointer(async_save=True).save(...)`` until it returns (the part
  that blocks training: state dict and staging in memory);
* ``new async wait()``: the same save until ``wait()`` has returned (files written and marked);
* ``old torch.save``: the former ``dmt.checkpoint.save``, re-implemented below (no fsync).

Prints the median time with its min-max per method, the bytes on disk per checkpoint (sum of the
file sizes), the ratios new/old and the machine's load (``os.getloadavg()``) before and after
(also in the ``--json`` file).

``--runs`` must be at least 3 (a median of fewer runs is not a result); ``--smoke`` allows 1 or
2 runs to check that the script runs, says loudly that its figures are not a result and marks
the ``--json`` file ``"smoke": true``.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from dmt.checkpoint import Checkpointer
from dmt.results import (
    add_runs_options,
    check_runs,
    compose_or_exit,
    existing_output,
    write_json,
)
from dmt.runtime import close_runtime, init_runtime
from dmt.trainer import Trainer

OVERRIDES = ["logger=disabled", "trainer.progress_bar=false"]
METHODS = ("new_sync", "new_async", "old")
ROWS = (  # (label, method, timing key)
    ("new sync", "new_sync", "ms"),
    ("new async save()", "new_async", "save_ms"),
    ("new async wait()", "new_async", "ms"),
    ("old torch.save", "old", "ms"),
)


# -- the former format (dmt/checkpoint.py at 6d8a42d), single process ----------------------------


def old_save(
    root: Path,
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    *,
    step: int,
    epoch: int,
    batch_in_epoch: int,
    rank: int,
    config: str | None,
) -> Path:
    """``<root>/step_<step>/rank_<rank>.pt`` (via a temp file and ``os.replace``), ``config.yaml``
    and ``meta.json``, as the old ``dmt.checkpoint.save`` wrote them (world of one: no barrier)."""
    path = Path(root) / f"step_{step}"
    path.mkdir(parents=True, exist_ok=True)
    parts = (
        [opt for _, opt in optimizer.optimizers]
        if hasattr(optimizer, "optimizers")
        else [optimizer]
    )
    state = {
        "model": model.state_dict(),
        "optimizer": [opt.state_dict() for opt in parts],
        "step": step,
        "epoch": epoch,
        "batch_in_epoch": batch_in_epoch,
        "rng": {
            "torch": torch.get_rng_state(),
            "numpy": np.random.get_state(),
            "python": random.getstate(),
        },
    }
    tmp = path / f".rank_{rank}.pt.tmp"
    torch.save(state, tmp)
    os.replace(tmp, path / f"rank_{rank}.pt")
    if rank == 0:
        if config is not None:
            tmp = path / ".config.yaml.tmp"
            tmp.write_text(config)
            os.replace(tmp, path / "config.yaml")
        meta = {
            "step": step,
            "epoch": epoch,
            "batch_in_epoch": batch_in_epoch,
            "world_size": 1,
            "cwd": os.getcwd(),
        }
        (path / "meta.json").write_text(json.dumps(meta) + "\n")
    return path


# -- measuring ------------------------------------------------------------------------------------


def dir_bytes(path: Path) -> int:
    """Sum of the sizes of every file under ``path``."""
    return sum(p.stat().st_size for p in Path(path).rglob("*") if p.is_file())


def save_once(method: str, trainer: Trainer, root: Path, config: str) -> dict[str, Any]:
    """One checkpoint of ``trainer``'s model and optimizer with ``method`` under the fresh ``root``."""
    kw = {"step": trainer.step, "epoch": 0, "batch_in_epoch": trainer.step}
    rec: dict[str, Any] = {"method": method}
    if method == "old":
        t0 = time.perf_counter()
        path = old_save(root, trainer.model, trainer.optimizer, rank=0, config=config, **kw)
        rec["ms"] = 1e3 * (time.perf_counter() - t0)
    else:
        ckpt = Checkpointer(root, rank=0, world_size=1, async_save=method == "new_async")
        t0 = time.perf_counter()
        path = ckpt.save(trainer.model, trainer.optimizer, config=config, **kw)
        rec["save_ms"] = 1e3 * (time.perf_counter() - t0)
        ckpt.wait()
        rec["ms"] = 1e3 * (time.perf_counter() - t0)
    rec["bytes"] = dir_bytes(path)
    rec["files"] = sorted(p.name for p in path.iterdir())
    return rec


def summarize(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per ``ROWS`` entry: median, min, max (ms), median bytes, ratio to the old format."""
    timed = [r for r in records if not r["warmup"]]

    def values(method: str, key: str) -> list[float]:
        return [r[key] for r in timed if r["method"] == method]

    old_ms = statistics.median(values("old", "ms"))
    old_bytes = statistics.median(values("old", "bytes"))
    rows = []
    for label, method, key in ROWS:
        ms, size = values(method, key), statistics.median(values(method, "bytes"))
        med = statistics.median(ms)
        rows.append(
            {
                "label": label,
                "median_ms": med,
                "min_ms": min(ms),
                "max_ms": max(ms),
                "n": len(ms),
                "bytes": size,
                "time_vs_old": med / old_ms,
                "size_vs_old": size / old_bytes,
            }
        )
    return rows


def print_table(rows: list[dict[str, Any]]) -> None:
    print(
        f"{'method':<18} {'median ms':>10} {'min-max ms':>17} {'n':>3} {'MB':>8} {'time new/old':>13} "
        f"{'size new/old':>13}"
    )
    for r in rows:
        rng = f"{r['min_ms']:.1f}-{r['max_ms']:.1f}"
        print(
            f"{r['label']:<18} {r['median_ms']:>10.1f} {rng:>17} {r['n']:>3} {r['bytes'] / 1e6:>8.3f} "
            f"{r['time_vs_old']:>13.2f} {r['size_vs_old']:>13.2f}"
        )


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_runs_options(ap, "timed saves per method")
    ap.add_argument(
        "--warmup", type=int, default=1, help="untimed saves per method first (default 1)"
    )
    ap.add_argument(
        "--train-steps", type=int, default=5, help="training steps before saving (default 5)"
    )
    ap.add_argument("--json", type=Path, help="write the per-save records and the summary here")
    ap.add_argument("--overwrite", action="store_true", help="replace an existing --json file")
    ap.add_argument(
        "overrides", nargs="*", help="extra Hydra overrides (default: the dmt-train defaults)"
    )
    args = ap.parse_args(argv)
    if (error := existing_output(args.json, "--json", args.overwrite)) is not None:
        ap.error(error)
    check_runs(ap, args.runs, args.smoke)
    if args.warmup < 0:
        ap.error(f"--warmup {args.warmup}: must be 0 or more")
    if args.train_steps < 0:
        ap.error(f"--train-steps {args.train_steps}: must be 0 or more")

    overrides = [*OVERRIDES, *args.overrides]
    conf = compose_or_exit(ap, overrides, args.overrides)
    tmp = Path(tempfile.mkdtemp(prefix="dmt_bench_ckpt_"))
    runtime = init_runtime("cpu")
    records: list[dict[str, Any]] = []
    load_start = os.getloadavg()
    try:
        trainer = Trainer(conf, runtime, tmp / "run")
        for i, batch in enumerate(trainer.data.train.batches(0)):
            if i >= args.train_steps:
                break
            trainer.train_step(batch)
        config = trainer.config_yaml()
        for run in range(args.warmup + args.runs):
            k = run % len(METHODS)
            for method in METHODS[k:] + METHODS[:k]:  # alternate, rotating which goes first
                rec = save_once(method, trainer, tmp / f"{method}_{run}", config)
                rec.update(run=run, warmup=run < args.warmup)
                records.append(rec)
                extra = f" (save() {rec['save_ms']:.1f} ms)" if method == "new_async" else ""
                tag = "warmup" if rec["warmup"] else f"run {run - args.warmup}"
                print(
                    f"{tag:<7} {method:<10} {rec['ms']:9.1f} ms{extra}  {rec['bytes'] / 1e6:.3f} MB",
                    flush=True,
                )
    finally:
        close_runtime()
        shutil.rmtree(tmp, ignore_errors=True)

    load_end = os.getloadavg()
    rows = summarize(records)
    print(
        f"\ncheckpoint save, overrides {' '.join(overrides)}, {args.train_steps} training steps, "
        f"{args.runs} runs (+{args.warmup} warmup), torch {torch.__version__}; load average "
        f"before {' '.join(f'{x:.2f}' for x in load_start)}, "
        f"after {' '.join(f'{x:.2f}' for x in load_end)}"
    )
    print_table(rows)
    if args.smoke:
        print("WARNING: --smoke run: not a result", file=sys.stderr)
    if args.json:
        payload = {
            "overrides": overrides,
            "runs": args.runs,
            "warmup": args.warmup,
            "train_steps": args.train_steps,
            "smoke": args.smoke,
            "load_avg_start": list(load_start),
            "load_avg_end": list(load_end),
            "records": records,
            "summary": rows,
        }
        write_json(args.json, payload, indent=1, replace=args.overwrite)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
