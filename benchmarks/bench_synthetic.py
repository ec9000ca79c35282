"""How fast does dmt's synthetic generator make rows? (issue 14, point 7: throughput runs should
measure training, not the loader.)

    .venv/bin/python benchmarks/bench_synthetic.py --runs 3
    .venv/bin/python benchmarks/bench_synthetic.py --data synthetic_random --rows 1048576

Per run it builds a fresh ``SyntheticWorld`` from ``data=<name>`` (default
``criteo_1tb_synthetic``: Zipf ids over Terabyte table sizes up to 48M rows) and times
``generate("train", rows)``, the world's construction included (that is where per-world tables
are built). Prints rows/s per run and the median, min and max, rows per CPU-second (all threads:
less sensitive to a loaded machine) and the machine load (``os.getloadavg()``, ``uptime``'s
averages) before and after.

``--runs`` must be at least 3 (a median of fewer runs is not a result); ``--smoke`` allows 1 or
2 runs to check that the script runs, and says loudly that its figures are not a result.
"""

from __future__ import annotations

import argparse
import copy
import os
import statistics
import sys
import time

from dmt.config import SyntheticConfig
from dmt.data.synthetic import SyntheticWorld
from dmt.results import add_runs_options, check_runs, compose_or_exit, config_options
from dmt.train import compose_config


def rows_per_s(synthetic: SyntheticConfig, rows: int, seed: int) -> tuple[float, float]:
    """Rows per second of wall-clock time and per second of CPU time (all threads)."""
    cfg = copy.deepcopy(synthetic)
    cfg.seed = seed
    wall, cpu = time.perf_counter(), time.process_time()
    split = SyntheticWorld(cfg).generate("train", rows)
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    assert split.sparse.shape[0] == rows
    return rows / wall, rows / cpu


def synthetic_data_configs() -> list[str]:
    """The ``dmt/conf/data`` options whose rows the synthetic generator makes
    (``data.kind=synthetic``)."""
    return [
        name
        for name in config_options("data")
        if compose_config(f"data={name}").data.kind == "synthetic"
    ]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--data",
        default="criteo_1tb_synthetic",
        help="a dmt/conf/data option of synthetic data (data.kind=synthetic)",
    )
    parser.add_argument("--rows", type=int, default=1 << 20, help="rows generated per run")
    add_runs_options(parser, "runs")
    args = parser.parse_args(argv)
    check_runs(parser, args.runs, args.smoke)
    if args.rows < 1:
        parser.error(f"--rows {args.rows}: must be at least 1")
    if args.data not in config_options("data"):
        parser.error(
            f"--data {args.data}: no such data config; this benchmark times the synthetic "
            f"generator: give a synthetic data config ({', '.join(synthetic_data_configs())})"
        )
    option = f"data={args.data}"
    data = compose_or_exit(parser, ["logger=disabled", option], {option: f"--data {args.data}"})
    if data.data.kind != "synthetic":
        parser.error(
            f"--data {args.data} is a {data.data.kind} data set (data.kind={data.data.kind}); "
            "this benchmark times the synthetic generator: give a synthetic data config "
            f"({', '.join(synthetic_data_configs())})"
        )
    print(f"load before: {os.getloadavg()}")
    rates, cpu_rates = [], []
    for run in range(args.runs):
        rate, cpu_rate = rows_per_s(data.data.synthetic, args.rows, seed=run)
        rates.append(rate)
        cpu_rates.append(cpu_rate)
        print(f"run {run}: {rate:,.0f} rows/s, {cpu_rate:,.0f} rows per CPU-second")
    print(
        f"data={args.data} rows={args.rows}: median {statistics.median(rates):,.0f} rows/s "
        f"(min {min(rates):,.0f}, max {max(rates):,.0f}), "
        f"{statistics.median(cpu_rates):,.0f} rows per CPU-second "
        f"(min {min(cpu_rates):,.0f}, max {max(cpu_rates):,.0f}); load after: {os.getloadavg()}"
    )
    if args.smoke:
        print("WARNING: --smoke run: not a result", file=sys.stderr)


if __name__ == "__main__":
    main()
