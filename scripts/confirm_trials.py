#!/usr/bin/env python
"""Confirm a sweep's best trials over more seeds before choosing settings.

A sweep scores each trial on one seed, so its best value flatters its trial (the winner's curse:
among ~40 trials, seed noise of ~0.001 AUC picks a lucky draw; the 40-trial DCN sweep's best
trial scored 0.7723 validation AUC, the same settings 0.7697 as the median of 9 seeds). This runs
the ``--top`` trials of a sweep directory again (their own overrides, ``trainer.seed`` from
``--seeds``, which must not include the seed the sweep ran them with), ranks them by the median
of the metric, and writes::

    OUT/trial<N>/seed_<S>/   each run (read back, not rerun, when its metrics.json exists);
                             <trial's directory>/ instead of trial<N>/ when two multiruns
                             in the sweep directory share trial numbers
    OUT/seeds.json, seeds.png  dmt.seeds' table and box plot of the metric
    OUT/confirm.json           ranking (trial, sweep value, median, std, overrides) and the choice

The metric is a validation metric (default ``val_auc``): settings are chosen on validation rows,
never on test rows. Runs already in OUT are read back when they trained with the same settings
(``dmt.seeds`` checks each against its ``seed_run.json``, and refuses one that did not): give each
sweep its own OUT (the default is inside the sweep); ``--overwrite`` replaces only
``confirm.json``, ``seeds.json`` and ``seeds.png`` (refused without it, before any training). Example, after ``dmt-train -m
hparams_search=criteo_forward_dcn``::

    OMP_NUM_THREADS=1 python scripts/confirm_trials.py multirun/2026-11-24/09-00-00-123 --top 5 \\
        --seeds 1-3
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path
from typing import Any

import yaml

from dmt.results import write_json
from dmt.seeds import (
    box_plot,
    format_report,
    output_dir_problem,
    parse_seeds,
    seeds_option,
    split_overrides,
    study,
)
from dmt.trials import Trial, override_list, read_trials, top_trials, trial_names

CONFIRM_FILE = "confirm.json"


def rank(
    report: dict[str, Any], sweep_values: dict[str, float | None], *, maximize: bool
) -> list[dict[str, Any]]:
    """Configs of a ``dmt.seeds.study`` report, best median first (ties: the sweep's order; a
    NaN median, from a diverged run, last)."""
    order = list(report["configs"])
    sign = -1.0 if maximize else 1.0

    def key(name: str) -> tuple[bool, float, int]:
        median = float(report["configs"][name]["median"])
        nan = math.isnan(median)
        return (nan, 0.0 if nan else sign * median, order.index(name))

    return [
        {
            "config": n,
            "sweep_value": sweep_values[n],
            "median": report["configs"][n]["median"],
            "std": report["configs"][n]["std"],
            "values": report["configs"][n]["values"],
            "overrides": report["configs"][n]["overrides"],
        }
        for n in sorted(order, key=key)
    ]


def sweep_seed(trial: Trial) -> int | None:
    """The ``trainer.seed`` the trial ran with (its ``.hydra/config.yaml``); None if unknown.

    Raises:
        ValueError: the file is not a YAML mapping with a mapping ``trainer`` (a damaged file,
            named in one line, not a traceback from yaml).
    """
    config = trial.directory / ".hydra" / "config.yaml"
    if not config.is_file():
        return None
    try:
        cfg = yaml.safe_load(config.read_text()) or {}
    except (OSError, ValueError, yaml.YAMLError) as e:  # a truncated file, UnicodeDecodeError
        raise ValueError(
            f"{config}: not a readable Hydra config ({type(e).__name__}: "
            f"{' '.join(str(e).split())}); move it, or the trial's directory, out of the sweep"
        ) from e
    if not isinstance(cfg, dict):
        raise ValueError(
            f"{config}: expected the trial's Hydra config, a YAML mapping, found "
            f"{type(cfg).__name__}"
        )
    trainer = cfg.get("trainer") or {}
    if not isinstance(trainer, dict):
        raise ValueError(
            f"{config}: expected the trial's Hydra config with a trainer mapping, found trainer: "
            f"{type(trainer).__name__}"
        )
    seed = trainer.get("seed")
    return seed if isinstance(seed, int) else None


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("sweep_dir", type=Path, help="the sweep directory (hydra.sweep.dir)")
    parser.add_argument("--top", type=int, default=5, help="trials to confirm (default 5)")
    parser.add_argument(
        "--seeds",
        type=seeds_option,
        default=parse_seeds("1-3"),
        help="seeds: K (0..K-1), LO-HI, a comma list, or a list of both; at least 2, none the "
        "sweep's (default 1-3)",
    )
    parser.add_argument("--metric", default="val_auc", help="metric (default val_auc)")
    parser.add_argument("--minimize", action="store_true", help="lower metric is better")
    parser.add_argument("--out", type=Path, help="output directory (default SWEEP_DIR/confirm)")
    parser.add_argument(
        "--common", default="", help="Hydra overrides for every run (one quoted string)"
    )
    parser.add_argument(
        "--overwrite",
        action="store_true",
        help=f"replace an existing OUT/{CONFIRM_FILE}, seeds.json and seeds.png",
    )
    args = parser.parse_args(argv)
    if not args.sweep_dir.is_dir():
        parser.error(f"{args.sweep_dir} is not a directory")
    if args.top < 1:
        parser.error(f"--top {args.top}: expected at least 1 trial")
    if len(args.seeds) < 2:
        parser.error(f"--seeds {args.seeds}: a median and a comparison need at least 2 seeds")
    out = args.out or args.sweep_dir / "confirm"
    if (error := output_dir_problem(out, "--out")) is not None:
        parser.error(error)
    common = split_overrides(parser, "--common", args.common)
    for name in (CONFIRM_FILE, "seeds.json", "seeds.png"):
        if (out / name).exists() and not args.overwrite:
            parser.error(f"{out / name} exists (--overwrite to replace it)")
    try:  # a folder of the sweep that is no trial, a damaged metrics.json: named, one line
        trials = read_trials(args.sweep_dir)
    except ValueError as e:
        parser.error(str(e))
    if not trials:
        parser.error(
            f"{args.sweep_dir} holds no trials (run directories with .hydra/overrides.yaml)"
        )
    maximize = not args.minimize
    try:
        best = top_trials(trials, args.metric, args.top, maximize=maximize)
    except ValueError as e:
        parser.error(f"{args.sweep_dir}: {e}")
    try:  # a damaged .hydra/config.yaml: named, one line
        used = sorted({s for t in best if (s := sweep_seed(t)) is not None} & set(args.seeds))
    except ValueError as e:
        parser.error(str(e))
    if used:
        parser.error(
            f"--seeds {args.seeds} include the seed(s) {used} the sweep scored its trials with; "
            "confirm with other seeds"
        )
    # trial<N>, or each trial's directory when two multiruns in the sweep share numbers (named
    # by number, one trial would replace the other)
    names_of = dict(
        zip((t.directory for t in trials), trial_names(trials, args.sweep_dir), strict=True)
    )
    configs = {names_of[t.directory]: override_list(t) for t in best}
    sweep_values = {names_of[t.directory]: t.value(args.metric) for t in best}
    names = list(configs)
    try:
        report = study(
            configs,
            args.seeds,
            out,
            metric=args.metric,
            common=common,
            pairs=[(names[0], n) for n in names[1:]],
        )
    except ValueError as err:  # a mistake of the command line (a bad override, StaleRun)
        parser.error(str(err))
    ranking = rank(report, sweep_values, maximize=maximize)
    result = {
        "sweep_dir": str(args.sweep_dir),
        "metric": args.metric,
        "seeds": list(args.seeds),
        "ranking": ranking,
        "chosen": ranking[0],
    }
    out.mkdir(parents=True, exist_ok=True)
    write_json(out / "seeds.json", report, replace=args.overwrite)
    box_plot(report, out / "seeds.png", replace=args.overwrite)
    write_json(out / CONFIRM_FILE, result, replace=args.overwrite)
    print(format_report(report))
    print(f"\nranked by median {args.metric} over seeds {list(args.seeds)}:")
    for r in ranking:
        print(
            f"  {r['config']:>8s}  median {r['median']:.4f} (std {r['std']:.4f})  "
            f"sweep {r['sweep_value']}  {' '.join(r['overrides'])}"
        )
    print(f"chosen: {ranking[0]['config']}; written to {out / CONFIRM_FILE}")
    return result


if __name__ == "__main__":
    main(sys.argv[1:])
