"""Pipelined training against the plain loop, side by side, alternating (issue 11).

Runs ``dmt-train`` with ``trainer.pipeline=true`` (and ``trainer.pipeline_world_of_one=true``,
so a single process is pipelined too) and ``false`` in turn, ``--runs`` times each,
single process or under ``torchrun --nproc-per-node``, and prints the median training samples/s
of each with its range and the ratio. Extra arguments are Hydra overrides for both sides.

    .venv/bin/python benchmarks/bench_pipeline.py --runs 3
    .venv/bin/python benchmarks/bench_pipeline.py --nproc 2 --runs 3 data.batch_size=2048
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
DEFAULTS = [
    "logger=disabled",
    "trainer.progress_bar=false",
    "data=synthetic_random",
    "data.synthetic.num_train=262144",
    "data.synthetic.num_val=1024",
    "data.synthetic.num_test=1024",
    "data.batch_size=1024",
    "trainer.eval_max_batches=1",
]


def run(pipeline: bool, nproc: int, overrides: list[str], out: Path) -> float:
    launcher = (
        [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}"]
        if nproc > 1
        else [sys.executable]
    )
    cmd = [
        *launcher,
        "-m",
        "dmt.train",
        *DEFAULTS,
        *overrides,
        f"trainer.pipeline={str(pipeline).lower()}",
        "trainer.pipeline_world_of_one=true",  # one process too: pipelined against plain
        f"hydra.run.dir={out}",
    ]
    env = dict(
        os.environ, PYTHONPATH=str(REPO), OMP_NUM_THREADS=str(max(1, os.cpu_count() // nproc))
    )
    subprocess.run(cmd, cwd=REPO, env=env, check=True, capture_output=True, text=True)
    return float(json.loads((out / "metrics.json").read_text())["train_samples_per_s"])


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--nproc", type=int, default=1)
    p.add_argument("overrides", nargs="*")
    args = p.parse_args(argv)
    rates: dict[bool, list[float]] = {True: [], False: []}
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(args.runs):
            for pipeline in (True, False) if i % 2 == 0 else (False, True):
                rate = run(pipeline, args.nproc, args.overrides, Path(tmp) / f"{pipeline}_{i}")
                rates[pipeline].append(rate)
                print(f"run {i} pipeline={pipeline}: {rate:,.0f} samples/s", flush=True)
    load = os.getloadavg()
    print(f"load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}; {args.nproc} process(es)")
    for pipeline, values in rates.items():
        print(
            f"pipeline={str(pipeline):5} median {statistics.median(values):>10,.0f} samples/s "
            f"(range {min(values):,.0f}-{max(values):,.0f})"
        )
    print(
        f"pipelined / plain: {statistics.median(rates[True]) / statistics.median(rates[False]):.3f}x"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
