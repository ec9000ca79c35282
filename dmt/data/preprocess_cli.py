"""``dmt-preprocess``: raw Criteo TSV to the arrays the loaders read.

Examples::

    # Kaggle: first 85% of train.txt for training, then 7.5% validation, 7.5% test
    dmt-preprocess /data/criteo-kaggle/train.txt /data/criteo-kaggle-prep

    # Terabyte: day_0..day_22 train, day_23 halved into validation and test; 40M-row tables
    dmt-preprocess /data/criteo-1tb /data/criteo-1tb-prep --categorical-mode hash --hash-sizes 40000000

    # Terabyte, forward in time: days 0..21 train, day 22 validation, day 23 test
    dmt-preprocess /data/criteo-1tb /data/criteo-1tb-fwd --train-days 0-21 --val-day 22 --eval-day 23 --categorical-mode hash --hash-sizes 40000000

    # any other raw file, through the vocabularies of a preprocessed directory
    dmt-preprocess /data/extra_day.tsv /data/extra-prep --vocab-from /data/criteo-kaggle-prep

See :mod:`dmt.data.criteo_preprocess` for the output layout and the id schemes.
"""

from __future__ import annotations

import argparse
import logging
import math
import os
import sys
from pathlib import Path

from dmt.data.criteo_config import DEFAULT_EVAL_DAY, DEFAULT_SPLIT_FRACTIONS, CriteoConfig
from dmt.data.criteo_preprocess import (
    DEFAULT_BLOCK_BYTES,
    DEFAULT_UNIT_BYTES,
    preprocess_criteo,
    read_manifest,
    transform_tsv,
)
from dmt.results import file_in_the_way


def _days(text: str) -> list[int]:
    """``"0-22"``, ``"0,3,5-7"`` -> list of days."""
    days: list[int] = []
    for part in text.replace(" ", ",").split(","):
        if not part:
            continue
        lo, sep, hi = part.partition("-")
        try:
            first, last = int(lo), int(hi) if sep else int(lo)
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"{text!r} is not a list of days like '0-22' or '0,1,5-7'"
            ) from None
        if last < first:
            raise argparse.ArgumentTypeError(
                f"{text!r}: the range {part!r} is reversed (expected FIRST-LAST, FIRST <= LAST)"
            )
        days += list(range(first, last + 1))
    return days


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="dmt-preprocess",
        description="Convert raw Criteo TSV (plain or .gz) into memory-mappable numpy arrays.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    p.add_argument("raw", help="Kaggle train.txt (one file) or a directory of day_<d> files")
    p.add_argument("output", help="output directory")
    p.add_argument(
        "--split-fractions",
        type=float,
        nargs=3,
        default=list(DEFAULT_SPLIT_FRACTIONS),
        metavar=("TRAIN", "VAL", "TEST"),
        help="one input file: chronological fractions of the lines",
    )
    p.add_argument(
        "--train-days", type=_days, default="0-22", help="directory input: training days"
    )
    p.add_argument(
        "--eval-day",
        type=int,
        default=DEFAULT_EVAL_DAY,
        help="directory input: the test day, halved into validation (first half) and test "
        "unless --val-day or --no-val is given",
    )
    p.add_argument(
        "--val-day",
        type=int,
        default=None,
        help="directory input: a whole day of validation rows (--eval-day is then all test)",
    )
    p.add_argument(
        "--no-val",
        action="store_true",
        help="no validation rows. Directory input: --eval-day all test (the forward protocol's "
        "refit: train days 0-22, test day 23); not with --val-day. One file: needs "
        "--split-fractions TRAIN 0 TEST",
    )
    p.add_argument("--categorical-mode", choices=("vocab", "hash"), default="vocab")
    p.add_argument(
        "--frequency-threshold",
        type=int,
        default=3,
        help="vocab mode: training occurrences needed for an own id (rarer: id 0)",
    )
    p.add_argument(
        "--missing-id",
        choices=("shared", "distinct"),
        default="shared",
        help="vocab mode: empty fields share id 0 with rare and unseen values, or get id 1",
    )
    p.add_argument(
        "--hash-sizes",
        type=int,
        nargs="+",
        default=[],
        help="hash mode: rows per table, one value for all features or 26 values",
    )
    p.add_argument(
        "--vocab-from",
        metavar="PREPROCESSED_DIR",
        help="map RAW (one file) through the vocabularies of PREPROCESSED_DIR into a test split",
    )
    p.add_argument(
        "--skip-bad-rows",
        action="store_true",
        help="drop and count malformed rows (and keep a truncated gzip's complete lines)",
    )
    p.add_argument("--num-workers", type=int, default=0, help="processes; 0: one per CPU core")
    p.add_argument(
        "--overwrite",
        action="store_true",
        help="replace a dmt-preprocess output made with other settings, or a damaged one, or "
        "one whose inputs only moved or were touched since (else used as it is; never a "
        "directory with other files in it or one that holds the input)",
    )
    p.add_argument("--no-progress", action="store_true", help="no progress bars")
    p.add_argument(
        "--block-mib",
        type=float,
        default=DEFAULT_BLOCK_BYTES / 2**20,
        help="MiB parsed at a time per process",
    )
    p.add_argument(
        "--unit-mib",
        type=float,
        default=DEFAULT_UNIT_BYTES / 2**20,
        help="MiB of a plain file handed to one process at a time",
    )
    return p


def _ignored(
    parser: argparse.ArgumentParser, args: argparse.Namespace
) -> list[tuple[list[str], str]]:
    """The options given that this input and mode would not read, grouped by reason:
    ``(options, what they apply to)``."""

    def given(names: list[str]) -> list[str]:
        def one(name: str) -> bool:
            default = parser.get_default(name)
            return getattr(args, name) != (_days(default) if name == "train_days" else default)

        return ["--" + n.replace("_", "-") for n in names if one(n)]

    def clause(names: list[str], reason: str) -> list[tuple[list[str], str]]:
        options = given(names)
        return [(options, reason)] if options else []

    if args.vocab_from is not None:
        names = ["split_fractions", "train_days", "eval_day", "val_day", "no_val"]
        names += ["categorical_mode", "frequency_threshold", "missing_id", "hash_sizes"]
        return clause(
            names, "only without --vocab-from (its vocabularies and settings are the directory's)"
        )
    days = os.path.isdir(args.raw)
    clauses = (
        clause(["split_fractions"], "only to one input file, not to a directory of days")
        if days
        else clause(
            ["train_days", "eval_day", "val_day"],
            "only to a directory of days, not to one input file",
        )
    )
    if args.categorical_mode == "hash":
        clauses += clause(
            ["frequency_threshold", "missing_id"],
            "only to --categorical-mode vocab, not to hash",
        )
    else:
        clauses += clause(["hash_sizes"], "only to --categorical-mode hash, not to vocab")
    return clauses


def config_of(args: argparse.Namespace) -> CriteoConfig:
    """The :class:`CriteoConfig` that ``dmt-preprocess``'s parsed ``args`` preprocess with."""
    return CriteoConfig(
        raw_path=args.raw,
        preprocessed_dir=args.output,
        split_fractions=list(args.split_fractions),
        train_days=args.train_days if isinstance(args.train_days, list) else _days(args.train_days),
        eval_day=args.eval_day,
        val_day=args.val_day,
        val_split=not args.no_val,
        categorical_mode=args.categorical_mode,
        frequency_threshold=args.frequency_threshold,
        missing_id=args.missing_id,
        hash_sizes=list(args.hash_sizes),
        skip_bad_rows=args.skip_bad_rows,
        num_workers=args.num_workers,
    )


def main(argv: list[str] | None = None) -> int:
    """Run ``dmt-preprocess``; returns the exit status (0 success, 1 bad input, 2 bad usage)."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if os.path.exists(args.raw):  # else the missing input is the error
        if ignored := _ignored(parser, args):
            one = sum(len(options) for options, _ in ignored) == 1
            parser.error(
                "; ".join(
                    f"{', '.join(options)} {'applies' if len(options) == 1 else 'apply'} {reason}"
                    for options, reason in ignored
                )
                + f": {'it' if one else 'they'} would be ignored; leave {'it' if one else 'them'}"
                " out"
            )
    logging.basicConfig(
        level=logging.INFO, format="%(levelname)s %(name)s: %(message)s", force=True
    )
    for option, mib in (("--block-mib", args.block_mib), ("--unit-mib", args.unit_mib)):
        if not (math.isfinite(mib) and mib > 0):
            parser.error(f"{option} {mib:g}: expected a positive number of MiB")
    block_bytes = max(1 << 16, int(args.block_mib * 2**20))
    unit_bytes = max(1 << 16, int(args.unit_mib * 2**20))
    if (blocking := file_in_the_way(Path(os.path.abspath(args.output)).parent)) is not None:
        parser.error(f"output directory {args.output}: {blocking} is not a directory")
    try:
        if args.vocab_from is not None:
            out = transform_tsv(
                args.vocab_from,
                args.raw,
                args.output,
                skip_bad_rows=args.skip_bad_rows,
                num_workers=args.num_workers,
                overwrite=args.overwrite,
                progress=not args.no_progress,
                block_bytes=block_bytes,
                unit_bytes=unit_bytes,
            )
        else:
            cfg = config_of(args)
            out = preprocess_criteo(
                cfg,
                overwrite=args.overwrite,
                progress=not args.no_progress,
                block_bytes=block_bytes,
                unit_bytes=unit_bytes,
            )
    except ValueError as e:
        print(f"dmt-preprocess: error: {e}", file=sys.stderr)
        return 1
    manifest = read_manifest(out)
    for split, info in manifest["splits"].items():
        rate = info["click_rate"]
        print(
            f"{split:5s} {info['rows']:>13,d} rows  click rate "
            + (f"{rate:.4f}" if rate is not None else "-")
            + f"  bad rows {info['bad_rows']:,d}"
        )
    print(f"cardinalities: {manifest['cardinalities']}")
    print(f"output: {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
