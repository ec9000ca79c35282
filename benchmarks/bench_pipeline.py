"""Pipelined training against the plain loop, side by side, alternating (issue 11).

Runs ``dmt-train`` with ``trainer.pipeline=true`` (and ``trainer.pipeline_world_of_one=true``,
so a single process is pipelined too) and ``false`` in turn, ``--runs`` times each, alternating
which goes first, single process or under ``torchrun --nproc-per-node``, and prints the median
training samples/s of each with its range (min-max), the ratio of the medians and the machine's
load (``os.getloadavg()``) before and after. Extra arguments are Hydra overrides for both sides.
``dmt-train`` runs in the working directory the script was started from, as it would from the
shell: relative paths in overrides (``model.partition.path=...``, ``data.criteo.*``) and in the
configs (``data_cache/...``) mean paths from there; the configs themselves ship in the package.

The figure compared is the rate after the first log interval (``trainer.log_every`` steps, 50 by
default): ``history.jsonl``'s ``train/samples_per_s`` of every later interval, weighted by its
steps (rank 0's training time, evaluations and checkpoints not counted). The first interval is
left out because it holds the first steps, where the pipelined side alone pays for TorchRec's fx
tracing of the model (seconds on a CPU): ``metrics.json``'s ``train_samples_per_s``, the whole
run's rate, includes them and so is biased against the pipeline, the more so the shorter the
run. It is printed too, for reference. A run with fewer than two log intervals has no
post-warmup figure: the script says so and falls back to the whole-run rate.

If a run fails (e.g. a misspelt override), the script stops and prints its command and its
stderr (Hydra's error).

``--runs`` must be at least 3 (a median of fewer runs is not a result); ``--smoke`` allows 1 or
2 runs to check that the script runs, and says loudly that its figures are not a result.

    .venv/bin/python benchmarks/bench_pipeline.py --runs 3
    .venv/bin/python benchmarks/bench_pipeline.py --nproc 2 --runs 3 data.batch_size=2048
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shlex
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from dmt.history import HISTORY_FILE, read_history
from dmt.results import add_runs_options, check_runs, load_average

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
RATE = "train/samples_per_s"


class RunFailed(RuntimeError):
    """A ``dmt-train`` run exited with an error; the message holds its command and stderr."""


def post_warmup_rate(run_dir: Path) -> float | None:
    """Samples/s over every log interval of ``history.jsonl`` after the first (each interval's
    rate weighted by its steps); ``None`` if there are fewer than two intervals."""
    steps, seconds_per_sample = 0, 0.0
    previous = None
    intervals = 0
    for record in read_history(run_dir / HISTORY_FILE):
        if RATE not in record:
            continue
        if previous is not None:
            rate, delta = record[RATE], record["step"] - previous
            if isinstance(rate, int | float) and math.isfinite(rate) and rate > 0 and delta > 0:
                steps += delta
                seconds_per_sample += delta / rate  # batch size cancels out
                intervals += 1
        previous = record["step"]
    return steps / seconds_per_sample if intervals else None


def run(pipeline: bool, nproc: int, overrides: list[str], out: Path) -> tuple[float | None, float]:
    """One ``dmt-train`` run: (post-warmup samples/s or ``None``, whole-run samples/s)."""
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
        os.environ,
        PYTHONPATH=str(REPO),
        OMP_NUM_THREADS=str(max(1, os.cpu_count() // nproc)),
        # python -m puts the working directory first on sys.path, where a dmt/ of the caller's
        # would shadow this repository's; PYTHONSAFEPATH (Python 3.11+) leaves it out
        PYTHONSAFEPATH="1",
    )
    # the caller's working directory, not REPO: relative paths mean what they do in dmt-train
    done = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if done.returncode != 0:
        raise RunFailed(
            f"dmt-train (trainer.pipeline={str(pipeline).lower()}) failed with exit status "
            f"{done.returncode}:\n  {shlex.join(cmd)}\nits stderr (the end):\n{done.stderr.rstrip()[-8000:]}"
        )
    whole = float(json.loads((out / "metrics.json").read_text())["train_samples_per_s"])
    return post_warmup_rate(out), whole


def _summary(label: str, values: list[float]) -> str:
    return (
        f"{label} median {statistics.median(values):>10,.0f} samples/s "
        f"(range {min(values):,.0f}-{max(values):,.0f})"
    )


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    add_runs_options(p, "runs of each side")
    p.add_argument("--nproc", type=int, default=1, help="processes (torchrun) per run")
    p.add_argument("overrides", nargs="*", help="Hydra overrides for both sides")
    args = p.parse_args(argv)
    check_runs(p, args.runs, args.smoke)
    if args.nproc < 1:
        p.error(f"--nproc {args.nproc}: must be at least 1")
    load_start = load_average()
    print(f"load average before: {load_start}", flush=True)
    post: dict[bool, list[float]] = {True: [], False: []}
    whole: dict[bool, list[float]] = {True: [], False: []}
    no_post_warmup = False
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(args.runs):
            for pipeline in (True, False) if i % 2 == 0 else (False, True):
                out = Path(tmp) / f"{pipeline}_{i}"
                try:
                    rate, rate_whole = run(pipeline, args.nproc, args.overrides, out)
                except RunFailed as e:
                    print(f"error: {e}", file=sys.stderr)
                    return 1
                if rate is None:
                    no_post_warmup = True
                    rate = rate_whole
                post[pipeline].append(rate)
                whole[pipeline].append(rate_whole)
                print(
                    f"run {i} pipeline={pipeline}: {rate:,.0f} samples/s after the first log "
                    f"interval, {rate_whole:,.0f} over the whole run",
                    flush=True,
                )
    print(
        f"load average before {load_start}, after {load_average()}; {args.nproc} process(es), "
        f"{args.runs} runs"
    )
    if no_post_warmup:
        print(
            "WARNING: a run logged fewer than two intervals (trainer.log_every too large for "
            "its steps): its figure below is the whole run's, first steps (fx tracing) included",
            file=sys.stderr,
        )
    for pipeline in (True, False):
        print(_summary(f"pipeline={str(pipeline):5} after warmup", post[pipeline]))
    for pipeline in (True, False):
        print(_summary(f"pipeline={str(pipeline):5} whole run   ", whole[pipeline]))
    ratio = statistics.median(post[True]) / statistics.median(post[False])
    ratio_whole = statistics.median(whole[True]) / statistics.median(whole[False])
    print(f"pipelined / plain: {ratio:.3f}x after warmup ({ratio_whole:.3f}x over whole runs)")
    if args.smoke:
        print("WARNING: --smoke run: not a result", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
