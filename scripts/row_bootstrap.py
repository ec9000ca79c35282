#!/usr/bin/env python
"""Is a difference in AUC between two models the models', or the evaluation rows'? A paired
bootstrap over the rows (:mod:`dmt.bootstrap`) of every run's per-row scores.

Score each run on the same rows with ``dmt-eval --predictions``, e.g. the runs of a
``scripts/seeds.py`` study trained with ``trainer.checkpoint=true``::

    for run in study/*/seed_*; do
      dmt-eval --checkpoint $run/checkpoints --data test --out $run/eval_test.json \\
        --predictions $run/pred_test.npz --no-progress
    done
    python scripts/row_bootstrap.py --group dlrm 'study/base/seed_*/pred_test.npz' \\
        --group dmt4 'study/tp4/seed_*/pred_test.npz' --out study/row_bootstrap_test.json

Each ``--group NAME FILE...`` is a model: its runs' predictions files, one per run (a quoted
glob stands for the files it matches; the path of an existing file is that file, glob characters
and all, as in Hydra's sweep directories: ``mlp=[64,16]/pred.npz``). The first group is compared
with every other one, or the pairs given with ``--pair A B`` (B against A): the difference of
their mean AUCs over runs, resampled over the rows (the difference of their medians, as the
seeds' tables report them, beside it). Prints a table and writes every comparison's report
(``--out``, JSON; an existing file is refused unless ``--overwrite``).
"""

from __future__ import annotations

import argparse
import glob
import sys
from pathlib import Path
from typing import Any

from dmt.bootstrap import format_report, load_predictions, row_bootstrap
from dmt.results import existing_output, write_json


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--group",
        nargs="+",
        action="append",
        required=True,
        metavar="NAME FILE",
        help="a model: its name, then its runs' predictions files, or globs of them in quotes "
        "(repeat)",
    )
    parser.add_argument(
        "--pair",
        nargs=2,
        action="append",
        default=[],
        metavar=("A", "B"),
        help="compare group B with group A (repeat); default: each other group with the first",
    )
    parser.add_argument("--resamples", type=int, default=2000, help="bootstrap resamples")
    parser.add_argument("--seed", type=int, default=0, help="seed of the resampling")
    parser.add_argument("--level", type=float, default=0.95, help="the interval's coverage")
    parser.add_argument(
        "--block",
        type=int,
        default=1,
        help="resample runs of this many consecutive rows (rows close in time are alike; "
        "default 1: single rows)",
    )
    parser.add_argument("--out", type=Path, help="write the reports here (JSON)")
    parser.add_argument("--overwrite", action="store_true", help="replace an existing --out")
    args = parser.parse_args(argv)
    if args.seed < 0:  # NumPy's message named no option
        parser.error(f"--seed {args.seed}: expected a non-negative integer")
    if error := existing_output(args.out, "--out", args.overwrite):
        parser.error(error)
    files: dict[str, list[str]] = {}
    for name, *patterns in args.group:
        if not patterns:
            parser.error(f"--group {name}: give its runs' predictions files after its name")
        if name in files:
            parser.error(f"--group {name} is given twice")
        files[name] = []
        for pattern in patterns:
            # an existing file is itself, not a pattern: Hydra's sweep directories are named by
            # their overrides, brackets and all (mlp=[64,16]/pred.npz)
            literal = Path(pattern).is_file()
            matched = [pattern] if literal else sorted(glob.glob(pattern, recursive=True))
            if not matched:
                parser.error(f"--group {name}: no file matches {pattern!r}")
            files[name] += [f for f in matched if f not in files[name]]
    inputs = [f for group in files.values() for f in group]
    if error := existing_output(args.out, "--out", args.overwrite, inputs=inputs):
        parser.error(error)  # checked again with the files the patterns matched
    names = list(files)
    pairs = [tuple(p) for p in args.pair] or [(names[0], other) for other in names[1:]]
    if not pairs:
        parser.error("give two --group (or more), or --pair")
    seen: set[tuple[str, ...]] = set()
    for a, b in pairs:
        for name in (a, b):
            if name not in files:
                parser.error(f"--pair {a} {b}: no --group {name}")
        if a == b:
            parser.error(f"--pair {a} {b} compares a group with itself: give two groups")
        if (a, b) in seen:
            parser.error(f"--pair {a} {b} is given twice")
        seen.add((a, b))
    try:
        labels, runs = load_predictions(files)
        reports = {
            f"{b} vs {a}": {
                "a_name": a,
                "b_name": b,
                "a_files": files[a],
                "b_files": files[b],
                **row_bootstrap(
                    runs[a],
                    runs[b],
                    labels,
                    resamples=args.resamples,
                    seed=args.seed,
                    level=args.level,
                    block=args.block,
                ),
            }
            for a, b in pairs
        }
    except ValueError as e:  # a bad file, or --resamples/--level/--block out of range
        parser.error(str(e))
    print(format_report(reports))
    if args.out is not None:
        print(f"written to {write_json(args.out, reports, replace=args.overwrite)}")
    return reports


if __name__ == "__main__":
    main(sys.argv[1:])
