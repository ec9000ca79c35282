"""Preprocess raw Criteo TSV into memory-mappable numpy arrays (the ``dmt-preprocess`` command).

Output directory layout::

    manifest.json                 rows, click rates, cardinalities, sources, settings, bad rows
    .dmt-criteo-preprocessed      marker: this directory is dmt-preprocess's (written first)
    vocab/cat_<f>.npy             vocab mode: sorted uint32 raw values; value i has id i + 1
    vocab/cat_<f>_counts.npy      vocab mode: their training counts (int64)
    <split>/dense.npy             float32 (R, 13): log(max(x, 0) + 1), empty -> 0
    <split>/sparse.npy            int32 (R, 26): categorical ids (see :mod:`dmt.data.criteo_vocab`)
    <split>/labels.npy            int8 (R,): 0 or 1

for ``split`` in train, val, test. Rows keep their order in the raw files.

Splits:

* a single input **file** (Kaggle ``train.txt``) is cut chronologically by line:
  ``split_fractions`` (default 85% / 7.5% / 7.5%);
* an input **directory** of ``day_<d>`` files (Terabyte; one per day, plain or gzip, named
  ``day_<d>``, ``day_<d>.tsv``, ``.txt``, ``.gz`` or ``.tsv.gz``: two for one day, such as
  ``day_5`` beside ``day_5.gz``, are refused) is cut by day: ``train_days`` (default
  0..22) train; ``eval_day`` (default 23) is halved, first ``ceil(n/2)`` lines validation, the
  rest test (as TorchRec does); or, with ``val_day`` set, ``val_day`` is the validation split and
  ``eval_day`` the test split, whole (the forward-in-time protocol: train days 0..21, validate
  on day 22, test on day 23); or, with ``val_split`` false, there are no validation rows and
  ``eval_day`` is the test split, whole (the protocol's refit: train days 0..22, test day 23).

Fractions and halves count raw lines; a skipped bad row leaves its split one row shorter.

How it runs (each step parallel over line-aligned byte ranges of the files, ``num_workers``
processes; gzip files are read whole, one per process):

0. count the lines of every file (to place every row before parsing anything);
1. parse every row once: labels and dense values go straight to their final place; raw
   categorical values are written into ``sparse.npy`` and counted over the training rows
   (hash mode maps them right away and skips step 2);
2. fit the vocabularies (ids for values seen ``frequency_threshold`` times in train) and map
   ``sparse.npy`` in place, chunk by chunk.

Memory is bounded by the block size times the processes, plus the vocabulary counts
(12 bytes per distinct training value and feature). Everything is written into a hidden
``.<name>.partial-<host>-<pid>`` sibling directory that is renamed to the output directory at
the end, so an interrupted run never leaves a complete-looking output; the next run on that host
removes partial directories of its processes that no longer exist (another host's are left
alone: their process may be alive there). A run whose output already exists with
the same settings and sources (``settings_hash`` in the manifest) and whose arrays all have the
sizes the manifest implies does nothing; so does one whose input files only moved or were
touched since (another path or modification time, the same size, gzip flag and sampled
fingerprint), with a warning naming them (``overwrite`` rebuilds it instead), and a
:func:`transform_tsv` output made through the same vocabularies (their settings hash) in another
place, their directory moved or copied since; a damaged one (a
missing or truncated array) is an error that names the file, or is rebuilt with ``overwrite``
(``rebuild_damaged`` for training).

What ``overwrite`` may replace: only a dmt-preprocess output (its manifest or marker present) that
holds nothing but files dmt-preprocess writes, and no input of the run. A directory holding
anything else is refused (nothing is deleted; the error names the entries), as is any other
existing directory except an empty one, which is used as is. Replacing removes only the files
dmt-preprocess writes. An output without any training row (every row malformed and skipped, or
no lines) is an error too: nothing is written.

Sources are recorded by path, size, modification time, gzip flag and a sampled fingerprint:
sha256 over the size, the first MiB and the last MiB (not a full-file hash, which would cost a
full read; 2 MiB a file, whatever its size); the rows are identified by all but the path and the
modification time.
"""

from __future__ import annotations

import dataclasses
import datetime
import hashlib
import io
import json
import logging
import math
import os
import re
import shutil
import socket
import stat
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import Future, ProcessPoolExecutor, as_completed
from dataclasses import dataclass, field
from multiprocessing import get_all_start_methods, get_context
from pathlib import Path
from typing import Any, Literal, TypeVar

import numpy as np
from tqdm import tqdm

from dmt.data.criteo_config import (
    DEFAULT_EVAL_DAY,
    DEFAULT_SPLIT_FRACTIONS,
    DEFAULT_TRAIN_DAYS,
    CriteoConfig,
)
from dmt.data.criteo_parse import (
    DEFAULT_BLOCK_BYTES,
    MAX_BAD_EXAMPLES,
    NO_LABEL_COLUMN,
    NUM_DENSE,
    NUM_SPARSE,
    CriteoFormatError,
    ReadInfo,
    count_lines,
    is_gzip,
    iter_line_blocks,
    line_aligned_offsets,
    parse_block,
    slice_lines,
)
from dmt.data.criteo_vocab import (
    KeyCounter,
    KeyIndex,
    count_keys,
    fit_vocabulary,
    hash_ids,
    vocab_ids,
    vocab_path,
)

logger = logging.getLogger(__name__)

FORMAT = "dmt-criteo-preprocessed"
FORMAT_VERSION = 1
SPLITS = ("train", "val", "test")
DENSE_NAMES = [f"int_{i}" for i in range(NUM_DENSE)]
SPARSE_NAMES = [f"cat_{i}" for i in range(NUM_SPARSE)]
ARRAY_FILES = {"dense": "dense.npy", "sparse": "sparse.npy", "labels": "labels.npy"}
MANIFEST = "manifest.json"
#: Written first into every output (and its partial directory): marks it as dmt-preprocess's.
MARKER = ".dmt-criteo-preprocessed"
_VOCAB_DIR = "vocab"
_VOCAB_FILE = re.compile(r"cat_\d+(_counts)?\.npy")
DEFAULT_UNIT_BYTES = 64 << 20
DEFAULT_MAP_ROWS = 1 << 20
#: Seconds each worker sleeps after a task; a debugging aid to interrupt runs on purpose.
PAUSE_ENV = "DMT_PREPROCESS_PAUSE_S"
_PRESENT = "present.npy"  # step 1 -> 2 only: which categorical fields were non-empty (bits)
_FINGERPRINT_BYTES = 1 << 20
_DAY_FILE_NAMES = ("day_{d}", "day_{d}.tsv", "day_{d}.txt", "day_{d}.gz", "day_{d}.tsv.gz")


# ---------------------------------------------------------------------------------------------
# Public API
# ---------------------------------------------------------------------------------------------


class OtherOutputError(ValueError):
    """The output directory holds a dmt-preprocess output made with other settings or sources
    (or an incomplete one): ``overwrite`` replaces it."""


def preprocess_criteo(
    cfg: CriteoConfig,
    *,
    overwrite: bool = False,
    rebuild_damaged: bool = False,
    progress: bool = True,
    block_bytes: int = DEFAULT_BLOCK_BYTES,
    unit_bytes: int = DEFAULT_UNIT_BYTES,
) -> Path:
    """Preprocess ``cfg.raw_path`` into ``cfg.preprocessed_dir`` (see the module docstring).

    Args:
        cfg (CriteoConfig): input, output, split, categorical and bad-row settings.
        overwrite (bool): replace an existing dmt-preprocess output made with other settings
            (or damaged, or whose inputs only moved or were touched since); never a directory
            that holds other files or an input.
        rebuild_damaged (bool): rebuild a damaged output made with these settings without
            ``overwrite`` (auto-preprocessing for training).
        progress (bool): show tqdm progress bars.
        block_bytes (int): bytes parsed at a time per process.
        unit_bytes (int): size of the byte ranges of a plain file handed to one process.

    Returns:
        Path: the output directory.

    Raises:
        ValueError: bad settings, missing inputs, a malformed row or file (a
            :class:`~dmt.data.criteo_parse.CriteoFormatError` naming file and line), no
            training rows, an existing output with other settings (an :class:`OtherOutputError`)
            or damaged when ``overwrite`` is False, or an existing directory that may not be
            replaced (see the module docstring).
    """
    cfg.validate()
    if cfg.raw_path is None:
        raise ValueError("raw_path is not set; expected the raw Criteo file or directory of days")
    raw = Path(cfg.raw_path)
    if raw.is_dir():
        if unread := unread_layout_settings(cfg, days=True):
            raise ValueError(
                f"{', '.join(unread)} applies only to one input file, but raw_path {str(raw)!r} "
                "is a directory of days, which train_days, val_day and eval_day split instead: "
                "it would be ignored; set raw_path to one file, or leave split_fractions at its "
                "default"
            )
        split_of_day = {d: "train" for d in cfg.train_days}
        layout = split_layout(cfg, days=True)
        if not cfg.val_split:
            split_of_day[cfg.eval_day] = "test"
        elif cfg.val_day is None:
            split_of_day[cfg.eval_day] = "val+test"
        else:
            split_of_day[cfg.val_day] = "val"
            split_of_day[cfg.eval_day] = "test"
        days = sorted(split_of_day)
        paths = [_find_day_file(raw, d) for d in days]

        def plan(lines: list[int]) -> list[_Assignment]:
            out = []
            for i, day in enumerate(days):
                split = split_of_day[day]
                if split == "val+test":
                    half = math.ceil(lines[i] / 2)
                    out += [_Assignment(i, 0, half, "val"), _Assignment(i, half, lines[i], "test")]
                else:
                    out.append(_Assignment(i, 0, lines[i], split))
            return out

    elif raw.is_file():
        if unread := unread_layout_settings(cfg, days=False):
            raise ValueError(
                f"{', '.join(unread)} apply only to a directory of days, but raw_path "
                f"{str(raw)!r} is one file, which split_fractions {list(cfg.split_fractions)} "
                "cut instead: they would be ignored; set raw_path to the directory of day_<d> "
                "files, or leave train_days, val_day and eval_day at their defaults"
            )
        if not cfg.val_split and cfg.split_fractions[1] != 0:
            raise ValueError(
                f"val_split is false (no validation rows) but split_fractions "
                f"{list(cfg.split_fractions)} give validation {cfg.split_fractions[1]} of "
                f"{str(raw)!r}; set split_fractions[1] to 0 (dmt-preprocess --split-fractions "
                "TRAIN 0 TEST)"
            )
        paths = [raw]
        layout = split_layout(cfg, days=False)

        def plan(lines: list[int]) -> list[_Assignment]:
            total = lines[0]
            b1 = round(total * cfg.split_fractions[0])
            b2 = max(b1, round(total * (cfg.split_fractions[0] + cfg.split_fractions[1])))
            return [
                _Assignment(0, 0, b1, "train"),
                _Assignment(0, b1, b2, "val"),
                _Assignment(0, b2, total, "test"),
            ]

    else:
        raise ValueError(f"raw_path {str(raw)!r} is neither a file nor a directory")

    settings = {
        "layout": layout,
        "categorical": _categorical_settings(cfg),
        "skip_bad_rows": cfg.skip_bad_rows,
    }
    job = _Job(
        sources=[_describe_source(p) for p in paths],
        settings=settings,
        plan=plan,
        vocab_from=None,
        out_dir=Path(os.path.abspath(cfg.preprocessed_dir)),  # "." has no name to make a sibling of
        num_workers=cfg.num_workers,
        skip_bad_rows=cfg.skip_bad_rows,
        block_bytes=block_bytes,
        unit_bytes=unit_bytes,
        progress=progress,
        overwrite=overwrite,
        rebuild_damaged=rebuild_damaged,
        inputs=[raw, *paths],
    )
    return _run(job)


def transform_tsv(
    vocab_dir: str | os.PathLike[str],
    tsv: str | os.PathLike[str],
    out_dir: str | os.PathLike[str] | None = None,
    *,
    skip_bad_rows: bool = False,
    num_workers: int = 0,
    overwrite: bool = False,
    rebuild_damaged: bool = False,
    progress: bool = True,
    block_bytes: int = DEFAULT_BLOCK_BYTES,
    unit_bytes: int = DEFAULT_UNIT_BYTES,
) -> Path:
    """Preprocess any raw Criteo TSV as a ``test`` split, through the vocabularies of ``vocab_dir``.

    Nothing is fitted: categorical values get the ids of the training vocabularies (or the same
    hashing), unseen values id 0, so the arrays fit the tables of a model trained on
    ``vocab_dir``. Like :func:`preprocess_criteo`, atomic and a no-op when already done.

    Args:
        vocab_dir: a directory written by :func:`preprocess_criteo`.
        tsv: the raw file (plain or gzip).
        out_dir: output directory; default ``<vocab_dir>.<tsv name>-<hash>`` beside ``vocab_dir``
            (the hash covers ``tsv``'s path and modification time and ``vocab_dir``'s path), or,
            when ``tsv`` only moved, was copied or touched since an earlier call without
            ``out_dir`` (another path or modification time, the same size, gzip flag and sampled
            fingerprint), that call's output beside ``vocab_dir``, used as it is with a warning
            naming the file (``overwrite`` transforms it anew into the default directory
            instead). So is an earlier output (that call's, or ``out_dir``) made through
            vocabularies that lay elsewhere then (``vocab_dir`` moved or copied, with the outputs
            beside it, under the same name): their settings hash is the same.
        skip_bad_rows, num_workers, overwrite, rebuild_damaged, progress, block_bytes,
            unit_bytes: as for :func:`preprocess_criteo`.

    Returns:
        Path: the output directory; its ``test`` split holds all rows of ``tsv``.
    """
    vocab_dir = Path(vocab_dir)
    parent = read_manifest(vocab_dir)
    if "vocab_from" in parent["settings"] and parent["settings"]["categorical"]["mode"] == "vocab":
        raise ValueError(
            f"{str(vocab_dir)!r} has no vocabularies of its own: it was made through those of "
            f"{parent['settings']['vocab_from']['dir']!r}; give that directory"
        )
    damage = output_damage(vocab_dir)
    if damage is not None:
        raise ValueError(f"{str(vocab_dir)!r} cannot lend its vocabularies: {damage}")
    source = _describe_source(Path(tsv))
    settings = {
        "layout": {"kind": "transform"},
        "vocab_from": {"dir": str(vocab_dir.resolve()), "settings_hash": parent["settings_hash"]},
        "categorical": parent["settings"]["categorical"],
        "skip_bad_rows": skip_bad_rows,
    }
    here = Path(os.path.abspath(vocab_dir))  # "." or "x/..": its name, beside it
    default = out_dir is None
    if out_dir is None:
        out_dir = here.parent / _transform_name(here, tsv, _settings_hash(settings, [source]))
    job = _Job(
        sources=[source],
        settings=settings,
        plan=lambda lines: [_Assignment(0, 0, lines[0], "test")],
        vocab_from=vocab_dir,
        out_dir=Path(os.path.abspath(out_dir)),
        num_workers=num_workers,
        skip_bad_rows=skip_bad_rows,
        block_bytes=block_bytes,
        unit_bytes=unit_bytes,
        progress=progress,
        overwrite=overwrite,
        rebuild_damaged=rebuild_damaged,
        inputs=[Path(tsv), vocab_dir],
        cardinalities=parent["cardinalities"],
    )
    if default and not (overwrite or job.out_dir.exists() or job.out_dir.is_symlink()):
        job.out_dir = _earlier_transform(job, here) or job.out_dir
    return _run(job)


def read_manifest(directory: str | os.PathLike[str]) -> dict[str, Any]:
    """The manifest of a complete preprocessed directory.

    Raises:
        ValueError: the directory has no complete manifest of this format.
    """
    path = Path(directory) / MANIFEST
    try:
        manifest = json.loads(path.read_text())
    except FileNotFoundError:
        raise ValueError(
            f"{str(directory)!r} is not a preprocessed Criteo directory (no {MANIFEST}); "
            "run dmt-preprocess first"
        ) from None
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ValueError(
            f"{path} is not a complete manifest ({e}): the directory is damaged; rebuild it "
            "with dmt-preprocess --overwrite"
        ) from None
    if not isinstance(manifest, dict):
        raise ValueError(f"{path}: expected a JSON object, got {type(manifest).__name__}")
    if manifest.get("format") != FORMAT or manifest.get("format_version") != FORMAT_VERSION:
        raise ValueError(
            f"{path}: expected format {FORMAT!r} version {FORMAT_VERSION}; got "
            f"{manifest.get('format')!r} version {manifest.get('format_version')!r}"
        )
    return manifest


def split_dir(directory: str | os.PathLike[str], split: str) -> Path:
    """Directory of one split's arrays."""
    return Path(directory) / split


# ---------------------------------------------------------------------------------------------
# Plan
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Source:
    path: str
    size: int
    mtime_ns: int
    fingerprint: str
    gzip: bool

    def identity(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclass(frozen=True)
class _Assignment:
    """Lines ``[line_lo, line_hi)`` of source ``source`` belong to ``split`` (in this order)."""

    source: int
    line_lo: int
    line_hi: int
    split: str


@dataclass(frozen=True)
class _Segment:
    split: str
    line_lo: int
    line_hi: int
    out_row: int  # row in the split's arrays of line ``line_lo`` (before bad-row compaction)
    count: bool  # count categorical values (training rows, vocab mode)


@dataclass(frozen=True)
class _Task:
    """One process's share of step 1: a line-aligned byte range of one file."""

    path: str
    byte_start: int
    byte_end: int | None
    first_line: int
    segments: tuple[_Segment, ...]


@dataclass(frozen=True)
class _Context:
    """What every step-1 task needs besides its range."""

    out_dir: str
    mode: str
    hash_sizes: tuple[int, ...]
    skip_bad_rows: bool
    block_bytes: int


@dataclass
class _SegmentResult:
    rows: int = 0
    clicks: int = 0
    bad_rows: int = 0
    bad_examples: list[str] = field(default_factory=list)


@dataclass
class _TaskResult:
    segments: list[_SegmentResult]
    counts: list[tuple[np.ndarray, np.ndarray]] | None  # per feature, training rows only
    bytes_read: int


@dataclass
class _Job:
    sources: list[_Source]
    settings: dict[str, Any]
    plan: Callable[[list[int]], list[_Assignment]]
    vocab_from: Path | None
    out_dir: Path
    num_workers: int
    skip_bad_rows: bool
    block_bytes: int
    unit_bytes: int
    progress: bool
    overwrite: bool
    rebuild_damaged: bool
    inputs: list[Path]  # as given (files or directories); may not lie inside out_dir
    cardinalities: list[int] | None = None


def _find_day_file(directory: Path, day: int) -> Path:
    names = [p.format(d=day) for p in _DAY_FILE_NAMES]
    found = [directory / name for name in names if (directory / name).is_file()]
    if len(found) > 1:  # e.g. day_5 next to day_5.gz: which rows are day 5 is not clear
        raise ValueError(
            f"{directory}: {len(found)} files for day {day} ({', '.join(p.name for p in found)}); "
            "expected one: move the others out of the directory"
        )
    if not found:
        raise ValueError(f"{directory}: no file for day {day}; expected one of {names}")
    return found[0]


def _describe_source(path: Path) -> _Source:
    if path.is_dir():
        raise ValueError(
            f"input {str(path)!r} is a directory; expected one raw Criteo TSV file (plain or gzip)"
        )
    if not path.is_file():
        raise ValueError(f"input file {str(path)!r} does not exist")
    st = path.stat()
    digest = hashlib.sha256(str(st.st_size).encode())
    with open(path, "rb") as f:
        digest.update(f.read(_FINGERPRINT_BYTES))
        if st.st_size > _FINGERPRINT_BYTES:
            f.seek(max(_FINGERPRINT_BYTES, st.st_size - _FINGERPRINT_BYTES))
            digest.update(f.read())
    return _Source(
        path=str(path.resolve()),
        size=st.st_size,
        mtime_ns=st.st_mtime_ns,
        fingerprint=digest.hexdigest(),
        gzip=st.st_size > 0 and is_gzip(path),
    )


def unread_layout_settings(cfg: CriteoConfig, *, days: bool) -> list[str]:
    """The split settings of ``cfg`` (other than their defaults) that its input would not read,
    each as ``<name> <value>``: ``split_fractions`` for a directory of days (``days``), or
    ``train_days``, ``val_day`` and ``eval_day`` for one file."""
    if days:
        given = {"split_fractions": list(cfg.split_fractions) != list(DEFAULT_SPLIT_FRACTIONS)}
    else:
        given = {
            "train_days": sorted(cfg.train_days) != list(DEFAULT_TRAIN_DAYS),
            "val_day": cfg.val_day is not None,
            "eval_day": cfg.eval_day != DEFAULT_EVAL_DAY,
        }
    return [f"{name} {getattr(cfg, name)!r}" for name, set_ in given.items() if set_]


def split_layout(cfg: CriteoConfig, *, days: bool) -> dict[str, Any]:
    """The ``settings.layout`` of a manifest made from ``cfg``: a directory of days, or one
    file cut by ``split_fractions``."""
    if not days:
        return {"kind": "fractions", "split_fractions": [float(f) for f in cfg.split_fractions]}
    layout: dict[str, Any] = {
        "kind": "days",
        "train_days": sorted(cfg.train_days),
        "eval_day": cfg.eval_day,
    }
    if not cfg.val_split:  # only then in the layout, as val_day
        layout["val_split"] = False
    elif cfg.val_day is not None:  # only then: outputs made before val_day existed stay valid
        layout["val_day"] = cfg.val_day
    return layout


def settings_differences(cfg: CriteoConfig, manifest: dict[str, Any]) -> list[str]:
    """Where ``cfg`` asks for other split or id settings than the directory of ``manifest`` was
    made with, each as ``<key>: <there> there, <asked> asked`` (the sources are not compared)."""
    there = manifest["settings"]

    def categorical(c: dict[str, Any]) -> dict[str, Any]:  # missing_id recorded when distinct
        return {"missing_id": "shared", **c} if c.get("mode") == "vocab" else c

    out = _dict_differences(
        categorical(there["categorical"]), categorical(_categorical_settings(cfg)), "categorical."
    )
    kind = there["layout"].get("kind")
    if kind in ("days", "fractions"):
        out += _dict_differences(there["layout"], split_layout(cfg, days=kind == "days"), "layout.")
        if unread := unread_layout_settings(cfg, days=kind == "days"):
            other = "fractions" if kind == "days" else "days"
            out.append(f"layout.kind: {kind!r} there, {other!r} asked ({', '.join(unread)})")
    return out


def train_fingerprint(
    directory: str | os.PathLike[str], manifest: dict[str, Any]
) -> dict[str, Any]:
    """What identifies the training rows of the preprocessed ``directory`` (its ``manifest``)
    wherever it and its inputs lie (no paths, no modification times): the format version, the
    preprocessing settings, the training split's rows and clicks, and the input line ranges it
    was read from, each with its file's size, lines, gzip flag and sampled fingerprint (sha256 of
    the size, first and last MiB). Cheap: the manifest's own records; no file is read.

    Raises:
        ValueError: the manifest lacks these records, naming it.
    """
    try:
        sources = {s["path"]: s for s in manifest["sources"]}
        train = manifest["splits"]["train"]
        return {
            "kind": "criteo",
            "format_version": manifest["format_version"],
            "settings": manifest["settings"],
            "train_rows": train["rows"],
            "train_clicks": train["clicks"],
            "train_lines": [
                {
                    **{k: sources[r["path"]][k] for k in ("size", "lines", "gzip", "fingerprint")},
                    "first_line": r["first_line"],
                    "last_line": r["last_line"],
                }
                for r in train["source_lines"]
            ],
        }
    except (KeyError, TypeError) as e:
        raise ValueError(
            f"{Path(directory) / MANIFEST} is not a complete manifest ({type(e).__name__}: {e}); "
            "rebuild the directory with dmt-preprocess --overwrite"
        ) from None


def _categorical_settings(cfg: CriteoConfig) -> dict[str, Any]:
    if cfg.categorical_mode == "hash":  # empty fields have id 0 to themselves either way
        return {"mode": "hash", "hash_sizes": cfg.table_hash_sizes()}
    settings: dict[str, Any] = {"mode": "vocab", "frequency_threshold": cfg.frequency_threshold}
    if cfg.missing_id != "shared":  # absent when shared: the outputs made before it stay valid
        settings["missing_id"] = cfg.missing_id
    return settings


def missing_id_of(categorical: dict[str, Any]) -> str:
    """The ``missing_id`` a manifest's ``settings.categorical`` was made with (vocab mode;
    ``shared`` when absent)."""
    return str(categorical.get("missing_id", "shared"))


def _settings_hash(settings: dict[str, Any], sources: Sequence[_Source]) -> str:
    blob = json.dumps(
        {
            "format": FORMAT,
            "format_version": FORMAT_VERSION,
            "settings": settings,
            "sources": [s.identity() for s in sources],
        },
        sort_keys=True,
    )
    return hashlib.sha256(blob.encode()).hexdigest()


# ---------------------------------------------------------------------------------------------
# Driver
# ---------------------------------------------------------------------------------------------


def _run(job: _Job) -> Path:
    out_dir = job.out_dir
    settings_hash = _settings_hash(job.settings, job.sources)
    if (out_dir.exists() or out_dir.is_symlink()) and _check_replaceable(job, settings_hash):
        logger.info("%s is up to date (%s)", out_dir, _up_to_date_note(out_dir, job, settings_hash))
        return out_dir
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    _remove_stale_partials(out_dir)
    tmp = out_dir.parent / f".{out_dir.name}.partial-{_owner()}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    _write_json(tmp / MARKER, {"format": FORMAT})
    start = time.perf_counter()
    try:
        with _Executor(job.num_workers) as ex:
            manifest = _build(job, tmp, ex)
        manifest["settings_hash"] = settings_hash
        _write_json(tmp / MANIFEST, manifest)
        _fsync_tree(tmp)
        if _is_up_to_date(out_dir, settings_hash):  # a concurrent run finished the same job
            shutil.rmtree(tmp)
            return out_dir
        if out_dir.exists() or out_dir.is_symlink():
            # checked again by the same rules as at the start: another run may have written it
            # (with other settings) while this one worked
            if _check_replaceable(job, settings_hash):
                shutil.rmtree(tmp)
                return out_dir
            old = out_dir.parent / f".{out_dir.name}.old-{_owner()}"
            out_dir.rename(old)
            tmp.rename(out_dir)
            _remove_output(old)
        else:
            try:
                tmp.rename(out_dir)
            except OSError:
                if _existing_hash(out_dir) != settings_hash:
                    raise
                shutil.rmtree(tmp)  # a concurrent run finished the same job just before us
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    rows = {s: manifest["splits"][s]["rows"] for s in manifest["splits"]}
    logger.info("wrote %s in %.1f s: %s", out_dir, time.perf_counter() - start, rows)
    return out_dir


def _check_replaceable(job: _Job, settings_hash: str) -> bool:
    """Whether the existing ``job.out_dir`` is up to date (False: it may be (re)written).

    Raises:
        ValueError: it may not be replaced, or not without ``overwrite``.
    """
    out_dir = job.out_dir
    existing = _existing_hash(out_dir)
    damage = None
    moved = None if existing == settings_hash or job.overwrite else _moved_sources(out_dir, job)
    if existing == settings_hash or moved is not None:
        damage = output_damage(out_dir)
        if damage is None:
            if moved:
                logger.warning(
                    "%s is used as it is: its input files moved or were modified since it was "
                    "made (%s), but each still has the recorded size and sampled fingerprint "
                    "(sha256 of its size, first MiB and last MiB), taken as the same rows; if a "
                    "file changed between those MiB, rebuild it with overwrite=True (--overwrite)%s",
                    out_dir,
                    "; ".join(moved),
                    ""
                    if job.vocab_from is None
                    else ", or delete it where dmt made it beside the preprocessed directory "
                    "(data.criteo.test_path and dmt-eval --data FILE have no overwrite)",
                )
            return True
    refusal = _refusal(out_dir, job.inputs)
    if refusal is not None:
        raise ValueError(f"output directory {str(out_dir)!r} {refusal}")
    if damage is not None:
        if not (job.overwrite or job.rebuild_damaged):
            raise ValueError(
                f"output directory {str(out_dir)!r} is damaged: {damage}; pass overwrite=True "
                "(--overwrite) to rebuild it"
            )
        logger.warning("%s is damaged (%s); rebuilding it", out_dir, damage)
    elif not job.overwrite and any(out_dir.iterdir()):
        why = (
            f"was made with other settings or sources{_settings_differences(out_dir, job)}"
            if existing
            else "is an incomplete or unreadable dmt-preprocess output"
        )
        raise OtherOutputError(
            f"output directory {str(out_dir)!r} exists and {why}; "
            "pass overwrite=True (--overwrite) to replace it or choose another directory"
        )
    return False


def _refusal(out_dir: Path, inputs: Sequence[Path]) -> str | None:
    """Why the existing ``out_dir`` may not be replaced (None: it may; see the module docstring)."""
    if out_dir.is_symlink():
        return (
            f"is a symbolic link (to {os.readlink(out_dir)!r}); dmt-preprocess replaces only "
            "real directories: give the directory it points to"
        )
    if not out_dir.is_dir():
        return "exists and is not a directory; choose another output directory"
    roots = {out_dir.absolute(), out_dir.resolve()}
    input_ids = set()
    for path in inputs:
        for form in (path.absolute(), path.resolve()):
            if any(form == root or root in form.parents for root in roots):
                return (
                    f"contains the input {str(path)!r}; dmt-preprocess never replaces a "
                    "directory that holds its input: choose another output directory"
                )
        if path.is_file():
            st = path.stat()
            input_ids.add((st.st_dev, st.st_ino))
    if not _is_dmt_output(out_dir):
        if not any(out_dir.iterdir()):
            return None  # empty: nothing to lose
        return (
            f"exists and is not a dmt-preprocess output (it has no {MANIFEST} or {MARKER}); "
            "dmt-preprocess replaces only its own outputs: choose another output directory "
            "or remove it yourself"
        )
    own, foreign = _scan_output(out_dir)
    for path in own:
        st = path.lstat()
        if (st.st_dev, st.st_ino) in input_ids:
            return (
                f"contains an input of this run as {str(path)!r}; dmt-preprocess never "
                "replaces a directory that holds its input: choose another output directory"
            )
    if foreign:
        return (
            f"is a dmt-preprocess output but also holds entries dmt-preprocess did not write "
            f"({_some(foreign)}); it is not replaced, so that nothing else is deleted: move "
            "them out or choose another output directory"
        )
    return None


def _is_dmt_output(directory: Path) -> bool:
    """Whether ``directory`` is a (complete, partial or older) output of dmt-preprocess."""
    if (directory / MARKER).is_file():
        return True
    try:
        return bool(json.loads((directory / MANIFEST).read_text()).get("format") == FORMAT)
    except (OSError, ValueError, AttributeError):
        return False


def _is_dmt_file(parts: tuple[str, ...]) -> bool:
    """Whether ``<output>/<parts>`` is a name dmt-preprocess writes (partial runs included)."""
    if len(parts) == 1:
        return parts[0] in (MANIFEST, MARKER)
    if len(parts) == 2 and parts[0] in SPLITS:
        return parts[1] in (*ARRAY_FILES.values(), _PRESENT)
    if len(parts) == 2 and parts[0] == _VOCAB_DIR:
        return _VOCAB_FILE.fullmatch(parts[1]) is not None
    return False


def _scan_output(root: Path) -> tuple[list[Path], list[str]]:
    """Files under ``root`` that dmt-preprocess writes, and the other entries (relative names)."""
    own: list[Path] = []
    foreign: list[str] = []
    subdirs = (*SPLITS, _VOCAB_DIR)
    for dirpath, dirnames, filenames in os.walk(root):
        rel = Path(dirpath).relative_to(root)
        keep = []
        for name in sorted(dirnames + filenames):
            path, parts = Path(dirpath, name), (rel / name).parts
            mode = path.lstat().st_mode
            if stat.S_ISDIR(mode) and len(parts) == 1 and name in subdirs:
                keep.append(name)
            elif stat.S_ISREG(mode) and _is_dmt_file(parts):
                own.append(path)
            else:
                foreign.append(str(rel / name) + ("/" if stat.S_ISDIR(mode) else ""))
        dirnames[:] = keep  # never descend into what dmt did not make
    return own, foreign


def _remove_output(root: Path) -> None:
    """Delete the files dmt-preprocess writes under ``root``, then the emptied directories.

    Anything else stays (with a warning), so nothing a user put there is ever deleted.
    """
    own, foreign = _scan_output(root)
    for path in own:
        path.unlink()
    for directory in [root / sub for sub in (*SPLITS, _VOCAB_DIR)] + [root]:
        try:
            directory.rmdir()
        except OSError:  # absent, or not empty: it holds what dmt did not write
            pass
    if foreign:
        logger.warning("left %s in place: it holds entries dmt did not write: %s", root, foreign)


def _build(job: _Job, tmp: Path, ex: _Executor) -> dict[str, Any]:
    sources = job.sources
    mode = job.settings["categorical"]["mode"]

    # Step 0: count lines per byte range.
    ranges: list[tuple[int, int, int | None]] = []  # (source, byte_start, byte_end)
    for i, s in enumerate(sources):
        if s.gzip or s.size == 0:
            ranges.append((i, 0, None))
        else:
            offsets = line_aligned_offsets(s.path, job.unit_bytes)
            ranges += [(i, a, b) for a, b in zip(offsets[:-1], offsets[1:])]
    counted = ex.map(
        _count_range,
        [(sources[i].path, a, b, job.skip_bad_rows, job.block_bytes) for i, a, b in ranges],
        desc="count lines",
        total_bytes=sum(s.size for s in sources),
        progress=job.progress,
        weight=lambda args: (args[2] or os.path.getsize(args[0])) - args[1],
    )
    lines = [0] * len(sources)
    range_first_line = []
    for (i, _, _), (n, _) in zip(ranges, counted):
        range_first_line.append(lines[i])
        lines[i] += n
    truncated = [
        {"path": sources[i].path, "complete_lines": lines[i]}
        for (i, _, _), (_, cut) in zip(ranges, counted)
        if cut
    ]
    empty_files = [s.path for s, n in zip(sources, lines) if n == 0]
    for path in empty_files:
        if not job.skip_bad_rows:
            raise CriteoFormatError(
                path, 1, "the file is empty; expected rows of 40 tab-separated fields"
            )
        logger.warning("%s is empty; skipped", path)

    # Place every line: split and row.
    assignments = [a for a in job.plan(lines) if a.line_hi > a.line_lo]
    split_lines = {s: 0 for s in SPLITS}
    placed: list[tuple[_Assignment, int]] = []
    for asg in assignments:
        placed.append((asg, split_lines[asg.split]))
        split_lines[asg.split] += asg.line_hi - asg.line_lo
    target = "test" if job.vocab_from is not None else "train"  # the split that must have rows
    if split_lines[target] == 0:
        raise ValueError(_no_rows_message(job, target, placed, empty_files, 0, []))
    count = mode == "vocab" and job.vocab_from is None
    tasks = []
    for (i, a, b), first, (n, _) in zip(ranges, range_first_line, counted):
        lo, hi = first, first + n
        segments = tuple(
            _Segment(
                split=asg.split,
                line_lo=max(lo, asg.line_lo),
                line_hi=min(hi, asg.line_hi),
                out_row=row + max(lo, asg.line_lo) - asg.line_lo,
                count=count and asg.split == "train",
            )
            for asg, row in placed
            if asg.source == i and asg.line_lo < hi and lo < asg.line_hi
        )
        if segments:
            tasks.append(_Task(sources[i].path, a, b, first, segments))

    # Step 1: parse every row into its final place.
    for split, n in split_lines.items():
        _create_arrays(tmp / split, n, with_present=mode == "vocab")
    ctx = _Context(
        out_dir=str(tmp),
        mode=mode,
        hash_sizes=tuple(job.settings["categorical"].get("hash_sizes", ())),
        skip_bad_rows=job.skip_bad_rows,
        block_bytes=job.block_bytes,
    )
    counters = [KeyCounter() for _ in range(NUM_SPARSE)] if count else None
    results: list[_TaskResult] = []

    def absorb(result: _TaskResult) -> None:
        if counters is not None and result.counts is not None:
            for counter, (keys, counts) in zip(counters, result.counts):
                counter.add(keys, counts)
            result.counts = None

    results = ex.map(
        _parse_task,
        [(t, ctx) for t in tasks],
        desc="parse",
        total_bytes=sum(s.size for s in sources),
        progress=job.progress,
        weight=lambda args: _task_bytes(args[0]),
        on_result=absorb,
    )
    target_results = [
        r for task, result in zip(tasks, results)
        for seg, r in zip(task.segments, result.segments) if seg.split == target
    ]  # fmt: skip
    if sum(r.rows for r in target_results) == 0:
        bad = sum(r.bad_rows for r in target_results)
        examples = [e for r in target_results for e in r.bad_examples]
        raise ValueError(_no_rows_message(job, target, placed, empty_files, bad, examples))

    # Step 2: vocabularies and ids.
    vocab_dir = job.vocab_from if job.vocab_from is not None else tmp
    distinct_missing = missing_id_of(job.settings["categorical"]) == "distinct"
    if mode == "vocab":
        if counters is not None:
            cardinalities = []
            for f, counter in enumerate(counters):
                keys, counts = counter.result()
                vocab = fit_vocabulary(
                    keys, counts, job.settings["categorical"]["frequency_threshold"]
                )
                vocab_file = vocab_path(tmp, f)
                vocab_file.parent.mkdir(exist_ok=True)
                np.save(vocab_file, vocab)
                np.save(vocab_file.with_name(f"cat_{f}_counts.npy"), counts[np.isin(keys, vocab)])
                cardinalities.append(len(vocab) + (2 if distinct_missing else 1))
            del counters
        else:
            assert job.cardinalities is not None
            cardinalities = list(job.cardinalities)
        run_id = uuid.uuid4().hex  # keys the workers' index cache to this run's vocabularies
        chunks = [
            (
                str(tmp / split),
                lo,
                min(lo + DEFAULT_MAP_ROWS, n),
                str(vocab_dir),
                run_id,
                distinct_missing,
            )
            for split, n in split_lines.items()
            for lo in range(0, n, DEFAULT_MAP_ROWS)
        ]
        ex.map(
            _map_chunk,
            chunks,
            desc="map ids",
            total_bytes=sum(c[2] - c[1] for c in chunks),
            progress=job.progress,
            weight=lambda args: args[2] - args[1],
            unit="rows",
        )
        _INDEX_CACHE.clear()
        for split in SPLITS:
            (tmp / split / _PRESENT).unlink()
    else:
        cardinalities = list(job.settings["categorical"]["hash_sizes"])

    # Close the gaps left by skipped rows; summarize.
    per_split: dict[str, list[tuple[_Segment, _SegmentResult]]] = {s: [] for s in SPLITS}
    for task, result in zip(tasks, results):
        for seg, seg_result in zip(task.segments, result.segments):
            per_split[seg.split].append((seg, seg_result))
    splits_out: dict[str, Any] = {}
    all_examples: list[str] = []
    for split in SPLITS:
        pieces = sorted(per_split[split], key=lambda p: p[0].out_row)
        rows = sum(r.rows for _, r in pieces)
        if rows < split_lines[split]:
            _compact(tmp / split, [(seg.out_row, r.rows) for seg, r in pieces], rows)
        clicks = sum(r.clicks for _, r in pieces)
        bad = sum(r.bad_rows for _, r in pieces)
        all_examples += [e for _, r in pieces for e in r.bad_examples]
        splits_out[split] = {
            "rows": rows,
            "clicks": clicks,
            "click_rate": clicks / rows if rows else None,
            "bad_rows": bad,
            "source_lines": [
                {
                    "path": sources[a.source].path,
                    "first_line": a.line_lo + 1,
                    "last_line": a.line_hi,
                }
                for a in assignments
                if a.split == split
            ],
            "files": {k: f"{split}/{v}" for k, v in ARRAY_FILES.items()},
        }
    total_bad = sum(s["bad_rows"] for s in splits_out.values())
    if total_bad:
        logger.warning("skipped %d malformed rows; first: %s", total_bad, all_examples[:1])

    categorical: dict[str, Any] = dict(job.settings["categorical"])
    if mode == "vocab" and distinct_missing:
        threshold = categorical["frequency_threshold"]
        categorical["id_0"] = (
            f"values seen fewer than {threshold} times in train, and values never seen in train"
        )
        categorical["id_1"] = "empty fields"
        categorical["ids"] = "2..V+1: kept values in increasing raw order (vocab/cat_<f>.npy)"
    elif mode == "vocab":
        threshold = categorical["frequency_threshold"]
        categorical["id_0"] = (
            f"empty fields, values seen fewer than {threshold} times in train, "
            "and values never seen in train"
        )
        categorical["ids"] = "1..V: kept values in increasing raw order (vocab/cat_<f>.npy)"
    else:
        categorical["id_0"] = "empty fields"
        categorical["ids"] = "1 + splitmix64(value | feature << 32) mod (size - 1)"
    manifest: dict[str, Any] = {
        "format": FORMAT,
        "format_version": FORMAT_VERSION,
        "settings": job.settings,
        "settings_hash": None,
        "sources": [
            {
                **s.identity(),
                "fingerprint_kind": "sha256(size, first MiB, last MiB)",
                "lines": n,
            }
            for s, n in zip(sources, lines)
        ],
        "splits": splits_out,
        "num_dense": NUM_DENSE,
        "dense_features": DENSE_NAMES,
        "sparse_features": SPARSE_NAMES,
        "cardinalities": cardinalities,
        "dense_transform": "float32 log(max(x, 0) + 1); empty -> 0",
        "categorical": categorical,
        "bad_rows": {"total": total_bad, "examples": all_examples[:MAX_BAD_EXAMPLES]},
        "truncated_files": truncated,
        "empty_files": empty_files,
    }
    return manifest


def _no_rows_message(
    job: _Job,
    split: str,
    placed: list[tuple[_Assignment, int]],
    empty_files: list[str],
    bad_rows: int,
    examples: list[str],
) -> str:
    """Why ``split`` got no rows, naming its inputs, what was read and dropped, and the cause."""
    lines = sum(a.line_hi - a.line_lo for a, _ in placed if a.split == split)
    paths = sorted({job.sources[a.source].path for a, _ in placed if a.split == split})
    paths = paths or [s.path for s in job.sources]
    named = _some([repr(p) for p in paths])
    what = "training rows" if split == "train" else "rows"
    if lines == 0:
        cause = (
            f"the files are empty ({', '.join(empty_files)})"
            if empty_files
            else "its share of the lines (data.criteo.split_fractions / --split-fractions) is empty"
        )
        return f"no {what}: the {split} split of {named} has no lines; likely cause: {cause}"
    if any("control character b'\\r'" in e for e in examples):
        cause = (
            "the file has Windows (CRLF) line endings; convert it first "
            "(dos2unix, or sed -i 's/\\r$//')"
        )
    elif any(NO_LABEL_COLUMN in e for e in examples):
        cause = (
            "the rows have no label column, like Criteo's Kaggle test.txt (Criteo never "
            "published its labels): train and score on labelled rows, e.g. train.txt's"
        )
    else:
        cause = "the input is not Criteo TSV (40 tab-separated fields per line)"
    first = f"; first: {examples[0]}" if examples else ""
    return (
        f"no {what}: all {lines:,d} lines read for the {split} split of {named} were malformed "
        f"and dropped ({bad_rows:,d} bad rows, skip_bad_rows / --skip-bad-rows), so nothing was "
        f"written; likely cause: {cause}{first}"
    )


def _some(items: Sequence[str], limit: int = 5) -> str:
    """The first ``limit`` items, comma-separated, and how many there are in all."""
    more = f", ... ({len(items)} in all)" if len(items) > limit else ""
    return ", ".join(items[:limit]) + more


def _task_bytes(task: _Task) -> int:
    end = task.byte_end if task.byte_end is not None else os.path.getsize(task.path)
    return end - task.byte_start


def _settings_differences(out_dir: Path, job: _Job) -> str:
    """Where ``out_dir``'s manifest differs from ``job``: its settings, as
    ``<key>: <there> there, <asked> asked``, and its sources, as ``source <i> <path>: <field>
    <there> there, <now> now``; `` (a; b)``, empty when nothing readable differs."""
    try:
        manifest = read_manifest(out_dir)
        there_settings = manifest["settings"]
        there_sources = manifest["sources"]
    except (OSError, ValueError, KeyError, TypeError):
        return ""
    both_vocab = all(
        isinstance(x, dict)
        and isinstance(x.get("categorical"), dict)
        and x["categorical"].get("mode") == "vocab"
        for x in (there_settings, job.settings)
    )
    diffs = (
        _dict_differences(
            _with_shared_missing_id(there_settings), _with_shared_missing_id(job.settings)
        )
        if both_vocab
        else _dict_differences(there_settings, job.settings)
    )
    if not isinstance(there_sources, list) or len(there_sources) != len(job.sources):
        n = len(there_sources) if isinstance(there_sources, list) else "?"
        diffs.append(f"{n} input files there, {len(job.sources)} asked")
    else:
        for i, (old, new) in enumerate(zip(there_sources, job.sources)):
            diffs.extend(_source_differences(i, old, new))
    return f" ({'; '.join(diffs)})" if diffs else ""


def _moved_sources(out_dir: Path, job: _Job) -> list[str] | None:
    """Where the input files of ``job`` differ from ``out_dir``'s manifest in path or
    modification time only (each as :func:`_source_differences` says); None where anything else
    differs: a setting, their number, a size, gzip flag or sampled fingerprint."""
    try:
        manifest = read_manifest(out_dir)
        there = manifest["sources"]
        if len(there) != len(job.sources):
            return None
        recorded = [
            dataclasses.replace(s, path=old["path"], mtime_ns=old["mtime_ns"])
            for old, s in zip(there, job.sources)
        ]
        settings = _with_recorded_vocab_dir(job, manifest)
    except (OSError, ValueError, KeyError, TypeError):
        return None
    if _settings_hash(settings, recorded) != manifest.get("settings_hash"):
        return None
    return [
        d
        for i, (old, s) in enumerate(zip(there, job.sources))
        for d in _source_differences(i, old, s, hint=False)
    ]


def _with_recorded_vocab_dir(job: _Job, manifest: dict[str, Any]) -> dict[str, Any]:
    """``job.settings`` with the vocabularies' directory that ``manifest`` records, for a
    :func:`transform_tsv` job: vocabularies are the same wherever their directory lies (moved or
    copied) if their settings hash (``vocab_from.settings_hash``, compared with the rest) is.

    Raises:
        KeyError, TypeError: ``manifest`` records no vocabularies' directory.
    """
    if job.vocab_from is None:
        return job.settings
    there = manifest["settings"]["vocab_from"]["dir"]
    return {**job.settings, "vocab_from": {**job.settings["vocab_from"], "dir": there}}


def _up_to_date_note(out_dir: Path, job: _Job, settings_hash: str) -> str:
    """What :func:`_run` says of the up-to-date ``out_dir``: the settings hash its manifest records
    and, where ``job``'s (``settings_hash``) differs, why: its input files or vocabularies
    moved or were touched since (:func:`_moved_sources`)."""
    try:
        manifest = read_manifest(out_dir)
        recorded = str(manifest["settings_hash"])
        there = _with_recorded_vocab_dir(job, manifest)
    except (OSError, ValueError, KeyError, TypeError):
        return f"settings hash {settings_hash[:12]}"
    if recorded == settings_hash:
        return f"settings hash {recorded[:12]}"
    why = []
    if _moved_sources(out_dir, job):
        why.append("its input files moved or were touched since")
    if there != job.settings:  # only the vocabularies' directory can differ
        asked = job.settings["vocab_from"]
        why.append(
            f"it was made through the vocabularies in {there['vocab_from']['dir']!r}, the same "
            f"(settings hash {asked['settings_hash'][:12]}) as those now in {asked['dir']!r}"
        )
    return (
        f"settings hash {recorded[:12]} in its {MANIFEST}; {settings_hash[:12]} where its inputs "
        f"are now: {'; '.join(why)}"
    )


def _earlier_transform(job: _Job, vocab_dir: Path) -> Path | None:
    """A complete, undamaged :func:`transform_tsv` output beside ``vocab_dir`` (its default name,
    ``<vocab_dir name>.<file name>-<hash>``) made with ``job``'s settings from an input file that
    only moved, was copied or touched since (:func:`_moved_sources`), under the name that file's
    path and modification time gave then; None where there is none."""
    prefix = f"{vocab_dir.name}."
    for candidate in sorted(vocab_dir.parent.iterdir()):
        if (
            candidate.name.startswith(prefix)
            and candidate.is_dir()
            and not candidate.is_symlink()
            and _moved_sources(candidate, job) is not None
            and candidate.name == _recorded_transform_name(vocab_dir, read_manifest(candidate))
            and output_damage(candidate) is None
        ):
            return candidate
    return None


def _transform_name(vocab_dir: Path, tsv: str | os.PathLike[str], settings_hash: str) -> str:
    """The name :func:`transform_tsv` gives its output by default, beside ``vocab_dir``."""
    return f"{vocab_dir.name}.{Path(tsv).name}-{settings_hash[:10]}"


def _recorded_transform_name(vocab_dir: Path, manifest: dict[str, Any]) -> str:
    """:func:`_transform_name` of the output ``manifest`` describes (not one a caller chose with
    ``out_dir``)."""
    return _transform_name(vocab_dir, manifest["sources"][0]["path"], manifest["settings_hash"])


def _with_shared_missing_id(settings: dict[str, Any]) -> dict[str, Any]:
    """Vocab-mode ``settings`` with ``categorical.missing_id: shared`` filled in (it is recorded
    only when distinct)."""
    return {**settings, "categorical": {"missing_id": "shared", **settings["categorical"]}}


def _dict_differences(there: Any, asked: Any, prefix: str = "") -> list[str]:
    if isinstance(there, dict) and isinstance(asked, dict):
        return [
            d
            for k in sorted(set(there) | set(asked))
            for d in _dict_differences(there.get(k), asked.get(k), f"{prefix}{k}.")
        ]
    if there == asked:
        return []
    return [f"{prefix.rstrip('.')}: {there!r} there, {asked!r} asked"]


def _source_differences(index: int, old: Any, new: _Source, *, hint: bool = True) -> list[str]:
    """What differs between a manifest's record of input file ``index`` and that file now
    (``hint``: saying so where only the modification time does)."""
    if not isinstance(old, dict):
        return [f"input file {index}: unreadable record there"]
    now = new.identity()
    fields = [k for k in now if old.get(k) != now[k]]
    if not fields:
        return []

    def modified(ns: Any) -> str:  # to the nanosecond: copies may keep the time to the second
        if not isinstance(ns, int):
            return repr(ns)
        at = datetime.datetime.fromtimestamp(ns // 10**9, datetime.UTC)
        return f"{at:%Y-%m-%d %H:%M:%S}.{ns % 10**9:09d} UTC"

    parts = []
    for k in fields:
        if k == "mtime_ns":
            parts.append(f"modified {modified(old.get(k))} there, {modified(now[k])} now")
        elif k == "fingerprint":
            parts.append("sampled fingerprint differs")
        else:
            parts.append(f"{k} {old.get(k)!r} there, {now[k]!r} now")
    if hint and fields == ["mtime_ns"]:
        parts.append(
            "same size and sampled fingerprint: touched or copied since, perhaps with the same rows"
        )
    return [f"input file {index} {new.path!r}: {', '.join(parts)}"]


def _existing_hash(out_dir: Path) -> str | None:
    try:
        return str(read_manifest(out_dir)["settings_hash"])
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None


def _owner() -> str:
    """``<host>-<pid>`` of this process: its temporary directories' suffix. The host keeps runs
    on several hosts sharing a file system apart (a pid means nothing on another host)."""
    return f"{socket.gethostname()}-{os.getpid()}"


def _left_by_a_dead_process(suffix: str) -> bool:
    """Whether the ``<host>-<pid>`` (or, from older versions, ``<pid>``) suffix of a temporary
    directory names a process of this host that no longer exists. Another host's are never
    stale here: their process may be alive there."""
    host, _, pid = suffix.rpartition("-")
    if not pid.isdigit() or host not in ("", socket.gethostname()):
        return False
    return not _pid_alive(int(pid))


def _remove_stale_partials(out_dir: Path) -> None:
    """Remove what interrupted runs of this host left beside ``out_dir`` (only dmt-preprocess's
    own files)."""
    for pattern in (f".{out_dir.name}.partial-*", f".{out_dir.name}.old-*"):
        prefix = pattern[:-1]
        for p in out_dir.parent.glob(pattern):
            if (
                _left_by_a_dead_process(p.name[len(prefix) :])
                and p.is_dir()
                and not p.is_symlink()
                and (_is_dmt_output(p) or not any(p.iterdir()))
            ):
                logger.info("removing %s, left by an interrupted run", p)
                _remove_output(p)


def _is_up_to_date(out_dir: Path, settings_hash: str) -> bool:
    return _existing_hash(out_dir) == settings_hash and output_damage(out_dir) is None


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _write_json(path: Path, obj: Any) -> None:
    path.write_text(json.dumps(obj, indent=2) + "\n")


def _fsync_tree(root: Path) -> None:
    for dirpath, _, filenames in os.walk(root):
        for name in filenames:
            fd = os.open(os.path.join(dirpath, name), os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)


# ---------------------------------------------------------------------------------------------
# Arrays
# ---------------------------------------------------------------------------------------------


def _array_specs(with_present: bool) -> dict[str, tuple[np.dtype, tuple[int, ...]]]:
    specs: dict[str, tuple[np.dtype, tuple[int, ...]]] = {
        ARRAY_FILES["dense"]: (np.dtype(np.float32), (NUM_DENSE,)),
        ARRAY_FILES["sparse"]: (np.dtype(np.int32), (NUM_SPARSE,)),
        ARRAY_FILES["labels"]: (np.dtype(np.int8), ()),
    }
    if with_present:
        specs[_PRESENT] = (np.dtype(np.uint8), ((NUM_SPARSE + 7) // 8,))
    return specs


def _create_arrays(directory: Path, rows: int, *, with_present: bool) -> None:
    directory.mkdir()
    for name, (dtype, tail) in _array_specs(with_present).items():
        if rows:
            np.lib.format.open_memmap(directory / name, "w+", dtype, (rows, *tail)).flush()
        else:
            np.save(directory / name, np.empty((0, *tail), dtype))


def open_array(path: str | os.PathLike[str], mode: Literal["r", "r+"] = "r") -> np.ndarray:
    """Memory-map a ``.npy`` array (``mode`` "r" or "r+"); an empty array is read normally.

    Raises:
        ValueError: the file is not a ``.npy`` array or is shorter or longer than its header
            says (naming the file and both sizes).
    """
    problem, shape, _ = _npy_problem(Path(path))
    if problem is not None:
        raise ValueError(problem)
    if math.prod(shape) == 0:
        return np.load(path)
    return np.load(path, mmap_mode=mode)


def _npy_problem(
    path: Path, expected: tuple[np.dtype, tuple[int, ...]] | None = None
) -> tuple[str | None, tuple[int, ...], np.dtype | None]:
    """What is wrong with the ``.npy`` file ``path`` (None: nothing), its shape and dtype.

    The file must hold exactly the bytes its header implies and, given ``expected``, that dtype
    and shape.
    """
    try:
        with open(path, "rb") as f:
            shape, fortran, dtype = _read_npy_header(f)
            data_start = f.tell()
        size = path.stat().st_size
    except FileNotFoundError:
        return f"{path} is missing", (), None
    except (OSError, ValueError, EOFError) as e:
        return f"{path} is not a readable .npy array ({e})", (), None
    if expected is not None and (dtype, shape) != expected:
        want_dtype, want_shape = expected
        return (
            f"{path} holds {dtype} {shape}; expected {want_dtype} {want_shape}",
            shape,
            dtype,
        )
    want = data_start + math.prod(shape) * dtype.itemsize
    if size != want:
        return (
            f"{path} is {size:,d} bytes; its {dtype} {shape} needs {want:,d} bytes",
            shape,
            dtype,
        )
    return None, shape, dtype


def output_damage(directory: str | os.PathLike[str]) -> str | None:
    """What is damaged in a complete preprocessed directory (None: nothing).

    Every array must exist with the dtype and shape the manifest implies (rows of each split,
    vocabulary sizes) and exactly the bytes that shape needs; the answer names the first file
    that does not.
    """
    root = Path(directory)
    try:
        manifest = read_manifest(root)
    except ValueError as e:  # it names the manifest and what is wrong with it
        return str(e)
    try:
        specs = _array_specs(with_present=False)
        expected: list[tuple[Path, np.dtype, tuple[int, ...]]] = []
        for split, info in manifest["splits"].items():
            rows = int(info["rows"])
            for name in ARRAY_FILES.values():
                dtype, tail = specs[name]
                expected.append((root / split / name, dtype, (rows, *tail)))
        settings = manifest["settings"]
        if settings["categorical"]["mode"] == "vocab" and "vocab_from" not in settings:
            # ids not in the vocabulary: the rare/unseen bucket, and a distinct missing id
            reserved = 2 if missing_id_of(settings["categorical"]) == "distinct" else 1
            for f, cardinality in enumerate(manifest["cardinalities"]):
                path = vocab_path(root, f)
                expected.append((path, np.dtype(np.uint32), (cardinality - reserved,)))
                counts = path.with_name(f"cat_{f}_counts.npy")
                expected.append((counts, np.dtype(np.int64), (cardinality - reserved,)))
    except (ValueError, KeyError, TypeError, AttributeError) as e:
        return f"{root / MANIFEST} is not a complete manifest ({type(e).__name__}: {e})"
    for path, dtype, shape in expected:
        problem, _, _ = _npy_problem(path, (dtype, shape))
        if problem is not None:
            return problem
    return None


def _compact(directory: Path, pieces: list[tuple[int, int]], rows: int) -> None:
    """Move pieces ``(start_row, num_rows)`` (in order) together and shrink the files to ``rows``."""
    for name in ARRAY_FILES.values():
        arr = open_array(directory / name, "r+")
        dst = 0
        for start, n in pieces:
            if start != dst:
                for a in range(0, n, DEFAULT_MAP_ROWS):
                    b = min(n, a + DEFAULT_MAP_ROWS)
                    arr[dst + a : dst + b] = arr[start + a : start + b]
            dst += n
        assert dst == rows
        if isinstance(arr, np.memmap):
            arr.flush()
        del arr
        _truncate_npy(directory / name, rows)


def _truncate_npy(path: Path, rows: int) -> None:
    """Rewrite a ``.npy`` header for fewer rows and cut the file after them."""
    with open(path, "r+b") as f:
        shape, fortran, dtype = _read_npy_header(f)
        data_start = f.tell()
        new_shape = (rows, *shape[1:])
        assert not fortran and rows <= shape[0]
        header = _npy_header(dtype, new_shape)
        assert len(header) == data_start, "npy headers are padded for growth of axis 0"
        f.seek(0)
        f.write(header)
        f.truncate(data_start + rows * math.prod(shape[1:]) * dtype.itemsize)


def _read_npy_header(f: Any) -> tuple[tuple[int, ...], bool, np.dtype]:
    version = np.lib.format.read_magic(f)
    if version == (1, 0):
        return np.lib.format.read_array_header_1_0(f)
    return np.lib.format.read_array_header_2_0(f)


def _npy_header(dtype: np.dtype, shape: tuple[int, ...]) -> bytes:
    buf = io.BytesIO()
    np.lib.format.write_array_header_1_0(
        buf, {"descr": np.lib.format.dtype_to_descr(dtype), "fortran_order": False, "shape": shape}
    )
    return buf.getvalue()


# ---------------------------------------------------------------------------------------------
# Worker functions (module level: they run in other processes)
# ---------------------------------------------------------------------------------------------


def _pause() -> None:
    seconds = float(os.environ.get(PAUSE_ENV, "0") or 0)
    if seconds > 0:
        time.sleep(seconds)


def _count_range(args: tuple[str, int, int | None, bool, int]) -> tuple[int, bool]:
    path, start, end, allow_truncated, block_bytes = args
    return count_lines(
        path,
        byte_start=start,
        byte_end=end,
        allow_truncated=allow_truncated,
        block_bytes=block_bytes,
    )


def _parse_task(args: tuple[_Task, _Context]) -> _TaskResult:
    task, ctx = args
    out = Path(ctx.out_dir)
    arrays: dict[str, dict[str, np.ndarray]] = {}
    for seg in task.segments:
        if seg.split not in arrays:
            arrays[seg.split] = {
                name: open_array(out / seg.split / name, "r+")
                for name in _array_specs(ctx.mode == "vocab")
            }
    results = [_SegmentResult() for _ in task.segments]
    cursors = [seg.out_row for seg in task.segments]
    counters = [KeyCounter() for _ in range(NUM_SPARSE)]  # memory: distinct keys, not rows
    count_any = any(seg.count for seg in task.segments)
    last_line = max(seg.line_hi for seg in task.segments)
    for block, first, num_lines in iter_line_blocks(
        task.path,
        byte_start=task.byte_start,
        byte_end=task.byte_end,
        first_line=task.first_line,
        block_bytes=ctx.block_bytes,
        allow_truncated=ctx.skip_bad_rows,
        info=ReadInfo(),
    ):
        for k, seg in enumerate(task.segments):
            lo, hi = max(first, seg.line_lo), min(first + num_lines, seg.line_hi)
            if lo >= hi:
                continue
            part = (
                block
                if (lo, hi) == (first, first + num_lines)
                else slice_lines(block, lo - first, hi - first)
            )
            rows = parse_block(part, path=task.path, first_line=lo, skip_bad_rows=ctx.skip_bad_rows)
            n = len(rows)
            r = cursors[k]
            split_arrays = arrays[seg.split]
            split_arrays[ARRAY_FILES["labels"]][r : r + n] = rows.labels
            split_arrays[ARRAY_FILES["dense"]][r : r + n] = rows.dense
            sparse = split_arrays[ARRAY_FILES["sparse"]]
            if ctx.mode == "hash":
                ids = np.empty((n, NUM_SPARSE), np.int32)
                for f in range(NUM_SPARSE):
                    ids[:, f] = hash_ids(rows.keys[:, f], rows.present[:, f], f, ctx.hash_sizes[f])
                sparse[r : r + n] = ids
            else:
                sparse[r : r + n] = rows.keys.view(np.int32)
                split_arrays[_PRESENT][r : r + n] = np.packbits(rows.present, axis=1)
                if seg.count:
                    for f in range(NUM_SPARSE):
                        counters[f].add(*count_keys(rows.keys[rows.present[:, f], f]))
            cursors[k] += n
            res = results[k]
            res.rows += n
            res.clicks += int(np.count_nonzero(rows.labels))
            res.bad_rows += rows.num_bad
            res.bad_examples += rows.bad_examples[: MAX_BAD_EXAMPLES - len(res.bad_examples)]
        if first + num_lines >= last_line:
            break
    del arrays  # written through shared mappings; _fsync_tree makes them durable at the end
    counts = None
    if count_any:
        counts = [c.result() for c in counters]
    _pause()
    return _TaskResult(segments=results, counts=counts, bytes_read=_task_bytes(task))


_INDEX_CACHE: dict[str, list[KeyIndex]] = {}


def _vocab_indexes(vocab_dir: str, run_id: str) -> list[KeyIndex]:
    if run_id not in _INDEX_CACHE:
        _INDEX_CACHE.clear()
        _INDEX_CACHE[run_id] = [
            KeyIndex(np.load(vocab_path(vocab_dir, f))) for f in range(NUM_SPARSE)
        ]
    return _INDEX_CACHE[run_id]


def _map_chunk(args: tuple[str, int, int, str, str, bool]) -> int:
    directory, lo, hi, vocab_dir, run_id, distinct_missing = args
    indexes = _vocab_indexes(vocab_dir, run_id)
    sparse = open_array(Path(directory) / ARRAY_FILES["sparse"], "r+")
    present_bits = open_array(Path(directory) / _PRESENT, "r")
    step = 1 << 16
    for a in range(lo, hi, step):
        b = min(hi, a + step)
        keys = np.ascontiguousarray(sparse[a:b]).view(np.uint32)
        present = np.unpackbits(present_bits[a:b], axis=1, count=NUM_SPARSE).view(bool)
        ids = np.empty(keys.shape, np.int32)
        for f, index in enumerate(indexes):
            ids[:, f] = vocab_ids(
                index.lookup(keys[:, f]), present[:, f], distinct_missing=distinct_missing
            )
        sparse[a:b] = ids
    del sparse
    _pause()
    return hi - lo


# ---------------------------------------------------------------------------------------------
# Parallel map with progress
# ---------------------------------------------------------------------------------------------

_T = TypeVar("_T")
_R = TypeVar("_R")


class _Executor:
    """Runs tasks in worker processes (or in this process when there is one worker)."""

    def __init__(self, num_workers: int) -> None:
        self.num_workers = num_workers or _available_cpus()
        self._pool: ProcessPoolExecutor | None = None

    def __enter__(self) -> _Executor:
        if self.num_workers > 1:
            # Workers only run numpy and file I/O, so forking is safe, and it skips re-importing
            # the package (torch, torchrec) in every worker, which costs seconds under spawn.
            method = "fork" if "fork" in get_all_start_methods() else "spawn"
            self._pool = ProcessPoolExecutor(
                self.num_workers,
                mp_context=get_context(method),
                initializer=_exit_with_parent,
                initargs=(os.getpid(),),
            )
        return self

    def __exit__(self, *exc: object) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)

    def map(
        self,
        fn: Callable[[_T], _R],
        items: Iterable[_T],
        *,
        desc: str,
        total_bytes: int,
        progress: bool,
        weight: Callable[[_T], int],
        on_result: Callable[[_R], None] | None = None,
        unit: str = "B",
    ) -> list[_R]:
        """``[fn(x) for x in items]`` in order, with a progress bar weighted by ``weight(x)``."""
        items = list(items)
        results: list[Any] = [None] * len(items)
        start = time.perf_counter()
        try:
            self._map(fn, items, results, desc, total_bytes, progress, weight, on_result, unit)
        finally:
            logger.info("%s: %.2f s", desc, time.perf_counter() - start)
        return results

    def _map(
        self,
        fn: Callable[[Any], Any],
        items: list[Any],
        results: list[Any],
        desc: str,
        total_bytes: int,
        progress: bool,
        weight: Callable[[Any], int],
        on_result: Callable[[Any], None] | None,
        unit: str,
    ) -> None:
        bar = tqdm(
            total=total_bytes,
            desc=desc,
            unit=unit,
            unit_scale=True,
            disable=not progress,
            leave=False,
        )
        with bar:
            if self._pool is None:
                for k, item in enumerate(items):
                    results[k] = fn(item)
                    if on_result is not None:
                        on_result(results[k])
                    bar.update(weight(item))
                return
            futures: dict[Future[Any], int] = {
                self._pool.submit(fn, item): k for k, item in enumerate(items)
            }
            try:
                for fut in as_completed(futures):
                    k = futures[fut]
                    results[k] = fut.result()
                    if on_result is not None:
                        on_result(results[k])
                    bar.update(weight(items[k]))
            except BaseException:
                for fut in futures:
                    fut.cancel()
                raise


def _exit_with_parent(parent: int) -> None:
    """Worker initializer: exit when the parent dies (e.g. killed), instead of idling forever."""

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(0.5)
        os._exit(1)

    threading.Thread(target=watch, name="parent-watch", daemon=True).start()


def _available_cpus() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1
