#!/usr/bin/env python
"""Repeated seeds and significance (paper §5.2, Table 6): train configs over K seeds, report the
median and standard deviation of a metric, and compare configs with the Mann-Whitney U test.

Each run is ``dmt.train.train`` in this process with ``trainer.seed=<seed>`` (weights and data
order; the synthetic world, ``data.synthetic.seed``, stays fixed), written to
``<out>/<config>/seed_<seed>/metrics.json``. Runs whose ``metrics.json`` exists are read, not
rerun, so an interrupted study resumes, and runs launched elsewhere (``--no-train``) are
collected, e.g. a Hydra multirun on a cluster::

    dmt-train -m experiment=paper_dmt_16t_dlrm trainer.seed='range(9)' \\
        hydra.sweep.dir=study/naive hydra.sweep.subdir='seed_${trainer.seed}'

The first ``--config`` is compared with every other one, or the pairs given with ``--pair A B``. Example (Table 6 on the CPU-sized
DMT-DLRM; ``tp.yaml`` from ``dmt-partition``)::

    python scripts/seeds.py --seeds 9 --out study \\
        --config tp "experiment=dmt_4t_dlrm partition=tp model.partition.path=tp.yaml" \\
        --config naive "experiment=dmt_4t_dlrm"

prints a table and writes ``study/seeds.json`` and ``study/seeds.png`` (a box plot of the metric
per config, every run a point); with another ``--metric`` than ``test_auc``,
``seeds_<metric>.json`` and ``.png`` (``--name`` chooses the stem), so that the tables of two
metrics of one study sit side by side. An earlier summary of that name is refused, before any
training, unless ``--overwrite`` (the runs themselves are read back, never replaced).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from dmt.results import write_json
from dmt.seeds import (
    ALTERNATIVES,
    box_plot,
    format_report,
    is_directory_name,
    output_dir_problem,
    parse_seeds,
    seeds_option,
    split_overrides,
    study,
)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--config",
        nargs=2,
        action="append",
        metavar=("NAME", "OVERRIDES"),
        required=True,
        help="a config: its name and its Hydra overrides in one quoted string (repeat)",
    )
    parser.add_argument(
        "--seeds",
        type=seeds_option,
        default=parse_seeds("9"),
        help="K (seeds 0..K-1), LO-HI, a comma list, or a list of both (0-8,18-26) (default 9, as the paper)",
    )
    parser.add_argument("--out", type=Path, required=True, help="study directory")
    parser.add_argument(
        "--common", default="", help="Hydra overrides for every config (one quoted string)"
    )
    parser.add_argument(
        "--metric", default="test_auc", help="metric from metrics.json (default test_auc)"
    )
    parser.add_argument(
        "--alternative",
        choices=ALTERNATIVES,
        default="two-sided",
        help="Mann-Whitney alternative for the first config against each other one",
    )
    parser.add_argument(
        "--pair",
        nargs=2,
        action="append",
        default=[],
        metavar=("A", "B"),
        help="compare config A with config B (repeat); default: the first config with each other",
    )
    parser.add_argument(
        "--method",
        choices=("auto", "exact", "asymptotic"),
        default="auto",
        help="SciPy's Mann-Whitney method (default auto: exact when a config has at most 8 runs "
        "and there are no ties)",
    )
    parser.add_argument(
        "--no-train", action="store_true", help="only read existing metrics.json files"
    )
    parser.add_argument(
        "--name",
        default=None,
        help="stem of the summary files in OUT (default seeds for test_auc, else seeds_<metric>)",
    )
    parser.add_argument(
        "--overwrite", action="store_true", help="replace an earlier summary of that name in OUT"
    )
    args = parser.parse_args(argv)
    if (error := output_dir_problem(args.out, "--out")) is not None:
        parser.error(error)
    if args.name is not None and not is_directory_name(args.name):
        parser.error(
            f"--name {args.name!r}: expected a file stem inside --out (no '/', not '.' or '..')"
        )
    stem = args.name or ("seeds" if args.metric == "test_auc" else f"seeds_{args.metric}")
    table, plot = args.out / f"{stem}.json", args.out / f"{stem}.png"
    for path in (table, plot):
        if path.exists() and not args.overwrite:
            parser.error(
                f"{path} exists (an earlier summary): pass --overwrite to replace it, or --name "
                "for another"
            )
    configs: dict[str, list[str]] = {}
    for name, overrides in args.config:
        if not is_directory_name(name):
            parser.error(
                f"--config {name!r}: a config's name is its directory in --out "
                "(OUT/NAME/seed_<S>); give a single name (no '/', not '.' or '..')"
            )
        if name in (table.name, plot.name):  # its directory, then the summary written over it
            parser.error(
                f"--config {name!r}: a config's name is its directory in --out, and "
                f"{args.out / name} is the study's summary; give the config another name (or "
                "--name another stem)"
            )
        configs[name] = split_overrides(parser, f"--config {name}", overrides)
    if len(configs) != len(args.config):
        parser.error("config names must be unique")
    common = split_overrides(parser, "--common", args.common)
    try:
        report = study(
            configs,
            args.seeds,
            args.out,
            metric=args.metric,
            common=common,
            train_missing=not args.no_train,
            alternative=args.alternative,
            method=args.method,
            pairs=[tuple(pair) for pair in args.pair],
        )
    except ValueError as err:  # a mistake of the command line (StaleRun, a bad override too)
        parser.error(str(err))
    args.out.mkdir(parents=True, exist_ok=True)
    write_json(table, report, replace=args.overwrite)
    box_plot(report, plot, replace=args.overwrite)
    print(format_report(report))
    print(f"written to {table} and {plot}")
    return report


if __name__ == "__main__":
    main(sys.argv[1:])
