"""Time the Tower Partitioner on synthetic planted affinities.

Cases: 1,000 features into 16 towers and 10,000 features into 64 towers (targets: under 10 s and
under 3 min on 2 CPU cores). Each case runs ``--runs`` times with different seeds; the script
prints per-run times of ``tower_partition`` (validation, distance, embedding, constrained K-Means,
with default settings), the embedding stress, the recovered block structure (adjusted Rand index
against the planted blocks), and per case the median time with its range (min-max) over the runs
and the machine's load (``os.getloadavg()``) before and after.

``--runs`` must be at least 3 (a median of fewer runs is not a result); ``--smoke`` allows 1 or
2 runs to check that the script runs, and says loudly that its figures are not a result.

    python scripts/bench_partitioner.py [--runs 3] [--cases 1000x16 10000x64]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

import numpy as np
from sklearn.metrics import adjusted_rand_score

from dmt.partitioner import tower_partition
from dmt.partitioner.synthetic import planted_affinity
from dmt.results import add_runs_options, check_runs, load_average


def _case(text: str) -> tuple[int, int]:
    """``FEATURESxTOWERS`` as two positive ints, towers at most features."""
    try:
        num_features, num_towers = (int(part) for part in text.split("x"))
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not FEATURESxTOWERS (e.g. 1000x16)"
        ) from None
    if not 1 <= num_towers <= num_features:
        raise argparse.ArgumentTypeError(f"{text!r}: needs 1 <= towers <= features")
    return num_features, num_towers


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    add_runs_options(parser, "runs per case")
    parser.add_argument(
        "--cases", nargs="+", type=_case, default=[_case("1000x16"), _case("10000x64")]
    )
    args = parser.parse_args(argv)
    check_runs(parser, args.runs, args.smoke)
    print(f"load average before: {load_average()}", flush=True)
    for num_features, num_towers in args.cases:
        # Blocks of uneven size, one per tower on average.
        sizes = np.full(num_towers, num_features // num_towers)
        sizes[: num_features % num_towers] += 1
        affinity, blocks = planted_affinity(sizes.tolist(), noise=0.1, seed=0)
        totals = []
        for run in range(args.runs):
            start = time.perf_counter()
            result = tower_partition(affinity, num_towers, "coherent", seed=run)
            totals.append(time.perf_counter() - start)
            ari = adjusted_rand_score(blocks, result.labels)
            print(
                f"{num_features} features -> {num_towers} towers, run {run}: "
                f"{totals[-1]:.2f} s, stress {result.stress:.3f}, ARI {ari:.3f}",
                flush=True,
            )
        print(
            f"{num_features} x {num_towers}: median {statistics.median(totals):.2f} s "
            f"(range {min(totals):.2f}-{max(totals):.2f}) over {args.runs} runs; "
            f"load average now {load_average()}",
            flush=True,
        )
        del affinity
    if args.smoke:
        print("WARNING: --smoke run: not a result", file=sys.stderr)


if __name__ == "__main__":
    main()
