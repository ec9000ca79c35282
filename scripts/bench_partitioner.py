"""Time the Tower Partitioner on synthetic planted affinities.

Cases: 1,000 features into 16 towers and 10,000 features into 64 towers (targets: under 10 s and
under 3 min on 2 CPU cores). Each case runs ``--runs`` times with different seeds; the script
prints per-run times of ``tower_partition`` (validation, distance, embedding, constrained K-Means,
with default settings), the embedding stress, the recovered block structure (adjusted Rand index
against the planted blocks) and the median time.

    python scripts/bench_partitioner.py [--runs 3] [--cases 1000x16 10000x64]
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np
from sklearn.metrics import adjusted_rand_score

from dmt.partitioner import tower_partition
from dmt.partitioner.synthetic import planted_affinity


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--cases", nargs="+", default=["1000x16", "10000x64"])
    args = parser.parse_args()
    for case in args.cases:
        num_features, num_towers = (int(part) for part in case.split("x"))
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
            f"{num_features} x {num_towers}: median {statistics.median(totals):.2f} s", flush=True
        )
        del affinity


if __name__ == "__main__":
    main()
