"""Criteo preprocessing against plain-Python references, on rows built here (never real rows)."""

from __future__ import annotations

import dataclasses
import datetime
import gzip
import json
import logging
import math
import os
import random
import re
import socket
import tarfile
import zlib
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

from dmt.data.criteo_config import CriteoConfig
from dmt.data.criteo_parse import (
    PAD_BYTES,
    CriteoFormatError,
    describe_row_problem,
    iter_line_blocks,
    parse_block,
)
from dmt.data.criteo_preprocess import (
    open_array,
    output_damage,
    preprocess_criteo,
    read_manifest,
    settings_differences,
    transform_tsv,
)
from dmt.data.criteo_vocab import hash_ids
from tests.conftest import typed_config

# Small blocks and ranges so that a few hundred rows cross many block and range boundaries.
SMALL = {"block_bytes": 1500, "unit_bytes": 6000, "progress": False}

EDGE_INTS = ["", "0", "-0", "-1", "-3", "7", "99999999", "100000000", "123456789012",
             str(2**63 - 1), str(10**30)]  # fmt: skip
EDGE_CATS = ["", "00000000", "ffffffff", "FFFFFFFF", "0a0B0c0D", "a", "1234567"]


def make_rows(n: int, seed: int = 0, pool: int = 12) -> list[str]:
    """``n`` raw Criteo lines (without newline) with empty, negative, big and odd-case values."""
    rng = random.Random(seed)
    pools = [[rng.randrange(2**32) for _ in range(pool)] for _ in range(26)]
    rows = []
    for _ in range(n):
        ints = []
        for _ in range(13):
            u = rng.random()
            ints.append(
                rng.choice(EDGE_INTS)
                if u < 0.3
                else str(rng.randrange(0, 3000 if u < 0.9 else 10**7))
            )
        cats = []
        for f in range(26):
            u = rng.random()
            if u < 0.1:
                cats.append(rng.choice(EDGE_CATS))
            else:
                # skewed: low indices are frequent, so thresholds matter
                cats.append(f"{pools[f][min(int(rng.expovariate(0.4)), pool - 1)]:08x}")
        rows.append("\t".join([str(int(rng.random() < 0.3)), *ints, *cats]))
    return rows


def write(path: Path, rows: list[str], *, trailing_newline: bool = True) -> Path:
    text = "\n".join(rows) + ("\n" if trailing_newline else "")
    if path.suffix == ".gz":
        path.write_bytes(gzip.compress(text.encode()))
    else:
        path.write_text(text)
    return path


def ref_parse(line: str) -> tuple[int, list[float], list[int | None]]:
    """Plain-Python reference: label, log(max(x, 0) + 1) per dense field, hex value or None."""
    f = line.split("\t")
    assert len(f) == 40
    dense = [math.log(max(int(x), 0) + 1) if x else 0.0 for x in f[1:14]]
    cats = [int(x, 16) if x else None for x in f[14:]]
    return int(f[0]), dense, cats


def ref_vocab(train_rows: list[str], threshold: int) -> list[dict[int, int]]:
    counts = [Counter() for _ in range(26)]
    for line in train_rows:
        for f, v in enumerate(ref_parse(line)[2]):
            if v is not None:
                counts[f][v] += 1
    return [
        {v: i + 1 for i, v in enumerate(sorted(k for k, c in cnt.items() if c >= threshold))}
        for cnt in counts
    ]


def load_split(out: Path, split: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    return tuple(np.load(out / split / f"{n}.npy") for n in ("dense", "sparse", "labels"))  # type: ignore[return-value]


def check_split(out: Path, split: str, rows: list[str], vocab: list[dict[int, int]]) -> None:
    dense, sparse, labels = load_split(out, split)
    assert dense.dtype == np.float32 and sparse.dtype == np.int32 and labels.dtype == np.int8
    assert dense.shape == (len(rows), 13) and sparse.shape == (len(rows), 26)
    ref = [ref_parse(r) for r in rows]
    np.testing.assert_array_equal(labels, [r[0] for r in ref])
    ref_dense = np.array([r[1] for r in ref], np.float32).reshape(len(rows), 13)
    np.testing.assert_allclose(dense, ref_dense, rtol=1e-6, atol=0)
    expected = [
        [vocab[f].get(v, 0) if v is not None else 0 for f, v in enumerate(r[2])] for r in ref
    ]
    np.testing.assert_array_equal(sparse, np.array(expected, np.int64).reshape(len(rows), 26))


def config(tmp_path: Path, raw: Path, **kw: object) -> CriteoConfig:
    return CriteoConfig(
        raw_path=str(raw), preprocessed_dir=str(tmp_path / "out"), num_workers=1, **kw
    )  # type: ignore[arg-type]


# -- parsing ----------------------------------------------------------------------------------


def test_parse_block_matches_reference() -> None:
    rows = make_rows(300, seed=1) + [
        "\t".join(
            ["1", *EDGE_INTS[:11], "5", "", *EDGE_CATS, *EDGE_CATS, *EDGE_CATS, "", "", "", "", ""]
        )
    ]
    block = np.frombuffer(PAD_BYTES + ("\n".join(rows) + "\n").encode(), np.uint8)
    parsed = parse_block(block, path="x.tsv", first_line=0)
    ref = [ref_parse(r) for r in rows]
    np.testing.assert_array_equal(parsed.labels, [r[0] for r in ref])
    np.testing.assert_allclose(parsed.dense, [r[1] for r in ref], rtol=1e-6, atol=0)
    np.testing.assert_array_equal(parsed.present, [[v is not None for v in r[2]] for r in ref])
    np.testing.assert_array_equal(parsed.keys, [[v or 0 for v in r[2]] for r in ref])
    assert parsed.num_bad == 0


def test_dense_values_of_thousands_of_digits() -> None:
    """Reproduced bug: a value of more digits than Python converts to an int (4300) stopped
    preprocessing with a bare ValueError naming no file or row, even with --skip-bad-rows."""
    big = ["9" * 5000, "1" + "0" * 4999, "0" * 4999 + "7", "12345678901234567890" * 20]
    rows = [_replace(GOOD[0], 1 + i, value) for i, value in enumerate(big)]
    block = np.frombuffer(PAD_BYTES + ("\n".join(rows) + "\n").encode(), np.uint8)
    parsed = parse_block(block, path="x.tsv", first_line=0)
    assert parsed.num_bad == 0
    expected = [
        5000 * math.log(10),  # log(10^5000 - 1 + 1)
        4999 * math.log(10),
        math.log(8),
        math.log(1.2345678901234567) + 399 * math.log(10),
    ]
    got = [parsed.dense[i, i] for i in range(len(big))]
    np.testing.assert_allclose(got, expected, rtol=1e-6)


def test_dense_values_at_the_edges_of_the_log_table() -> None:
    """``log(x + 1)`` rounded once to float32, exactly, on both sides of the 2**16-entry lookup
    table the small values are read from (and of the 8-digit fast path)."""
    values = [65534, 65535, 65536, 65537, 70000, 99999999, 100000000, -99999999, -100000000]
    rows = [_replace(GOOD[0], 1, str(v)) for v in values]
    block = np.frombuffer(PAD_BYTES + ("\n".join(rows) + "\n").encode(), np.uint8)
    got = parse_block(block, path="x.tsv", first_line=0).dense[:, 0]
    expected = [math.log(max(v, 0) + 1) for v in values]  # negative values clamp to 0
    np.testing.assert_array_equal(got, np.array(expected, np.float32))


@pytest.mark.parametrize("block_bytes", [64, 1000, 1 << 20])
@pytest.mark.parametrize("suffix", [".tsv", ".gz"])
@pytest.mark.parametrize("trailing_newline", [True, False])
def test_line_blocks_any_size(
    tmp_path: Path, block_bytes: int, suffix: str, trailing_newline: bool
) -> None:
    rows = make_rows(57, seed=2)
    path = write(tmp_path / f"d{suffix}", rows, trailing_newline=trailing_newline)
    keys, lines = [], []
    for block, first, n in iter_line_blocks(str(path), block_bytes=block_bytes):
        p = parse_block(block, path=str(path), first_line=first)
        assert len(p) == n
        keys.append(p.keys)
        lines.append(first)
    assert lines == sorted(lines) and lines[0] == 0
    np.testing.assert_array_equal(
        np.concatenate(keys), [[v or 0 for v in ref_parse(r)[2]] for r in rows]
    )


def test_multi_member_gzip(tmp_path: Path) -> None:
    rows = make_rows(30, seed=17)
    path = tmp_path / "d.gz"
    path.write_bytes(
        gzip.compress(("\n".join(rows[:10]) + "\n").encode())
        + gzip.compress(("\n".join(rows[10:]) + "\n").encode())
    )
    keys = [
        parse_block(b, path=str(path), first_line=f).keys for b, f, _ in iter_line_blocks(str(path))
    ]
    np.testing.assert_array_equal(
        np.concatenate(keys), [[v or 0 for v in ref_parse(r)[2]] for r in rows]
    )


# -- full preprocessing -----------------------------------------------------------------------


def test_preprocess_kaggle_layout_matches_reference(tmp_path: Path) -> None:
    rows = make_rows(400, seed=3)
    raw = write(tmp_path / "train.txt", rows)
    out = preprocess_criteo(config(tmp_path, raw, split_fractions=[0.7, 0.2, 0.1]), **SMALL)
    b1, b2 = 280, 360
    vocab = ref_vocab(rows[:b1], threshold=3)
    check_split(out, "train", rows[:b1], vocab)
    check_split(out, "val", rows[b1:b2], vocab)
    check_split(out, "test", rows[b2:], vocab)
    m = read_manifest(out)
    assert [m["splits"][s]["rows"] for s in ("train", "val", "test")] == [280, 80, 40]
    clicks = sum(r.startswith("1") for r in rows[:b1])
    assert m["splits"]["train"]["clicks"] == clicks
    assert m["splits"]["train"]["click_rate"] == pytest.approx(clicks / b1)
    assert m["cardinalities"] == [len(v) + 1 for v in vocab]
    for f, v in enumerate(vocab):
        np.testing.assert_array_equal(np.load(out / "vocab" / f"cat_{f}.npy"), sorted(v))


def test_vocabulary_is_fitted_on_train_only(tmp_path: Path) -> None:
    a, b = "0000000a", "0000000b"
    cats = lambda v: [v] * 26  # noqa: E731
    ints = ["1"] * 13
    train = ["\t".join(["0", *ints, *cats(a)])] * 4  # a: 4 times in train
    later = ["\t".join(["1", *ints, *cats(b)])] * 10  # b: frequent, but only after train
    rows = train + later
    raw = write(tmp_path / "train.txt", rows)
    out = preprocess_criteo(
        config(tmp_path, raw, split_fractions=[4 / 14, 5 / 14, 5 / 14], frequency_threshold=1),
        **SMALL,
    )
    assert (load_split(out, "train")[1] == 1).all()
    assert (load_split(out, "val")[1] == 0).all()  # b is unseen in train: shared bucket
    assert (load_split(out, "test")[1] == 0).all()
    assert read_manifest(out)["cardinalities"] == [2] * 26


@pytest.mark.parametrize("threshold", [1, 2, 3, 5])
def test_frequency_threshold(tmp_path: Path, threshold: int) -> None:
    ints = [""] * 13
    # value v appears v times; values 1..5
    rows = ["\t".join(["0", *ints, *([f"{v:x}"] * 26)]) for v in range(1, 6) for _ in range(v)]
    random.Random(0).shuffle(rows)
    raw = write(tmp_path / "train.txt", rows)
    out = preprocess_criteo(
        config(tmp_path, raw, split_fractions=[1.0, 0.0, 0.0], frequency_threshold=threshold),
        **SMALL,
    )
    kept = [v for v in range(1, 6) if v >= threshold]
    sparse = load_split(out, "train")[1]
    for line, ids in zip(rows, sparse):
        v = int(line.split("\t")[14], 16)
        assert (ids == (kept.index(v) + 1 if v in kept else 0)).all()
    assert read_manifest(out)["cardinalities"] == [len(kept) + 1] * 26


def splitmix64(x: int) -> int:
    mask = 2**64 - 1
    z = (x + 0x9E3779B97F4A7C15) & mask
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & mask
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & mask
    return z ^ (z >> 31)


def test_hash_mode(tmp_path: Path) -> None:
    rows = make_rows(120, seed=4)
    raw = write(tmp_path / "train.txt", rows)
    sizes = [2 + 7 * f for f in range(26)]
    out = preprocess_criteo(
        config(tmp_path, raw, categorical_mode="hash", hash_sizes=sizes), **SMALL
    )
    m = read_manifest(out)
    assert m["cardinalities"] == sizes
    assert not (out / "vocab").exists()
    got = np.concatenate([load_split(out, s)[1] for s in ("train", "val", "test")])
    for line, ids in zip(rows, got):
        for f, v in enumerate(ref_parse(line)[2]):
            want = 0 if v is None else 1 + splitmix64(v | f << 32) % (sizes[f] - 1)
            assert ids[f] == want


def test_hash_sizes_must_fit_the_int32_ids(tmp_path: Path) -> None:
    """Ids run up to size - 1: a size above 2**31 would give negative int32 ids (a reproduced
    bug); it is refused."""
    raw = tmp_path / "train.txt"
    config(tmp_path, raw, categorical_mode="hash", hash_sizes=[2**31]).validate()
    keys = np.arange(0, 2**32 - 1, 65537, dtype=np.uint32)  # 65,536 keys across the range
    ids = hash_ids(keys, np.ones(len(keys), bool), 0, 2**31).astype(np.int64)
    assert ids.min() >= 1 and ids.max() <= 2**31 - 1 and ids.max() > 2**30
    with pytest.raises(ValueError) as err:
        config(tmp_path, raw, categorical_mode="hash", hash_sizes=[2**31 + 1]).validate()
    assert str(err.value) == (
        "hash_sizes must be <= 2147483648 (ids are stored as int32); got [2147483649]"
    )


def test_terabyte_days(tmp_path: Path) -> None:
    days = tmp_path / "days"
    days.mkdir()
    per_day = [make_rows(n, seed=10 + d) for d, n in enumerate([30, 20, 11])]
    write(days / "day_0", per_day[0])
    write(days / "day_1.gz", per_day[1])
    write(days / "day_2.tsv", per_day[2])
    out = preprocess_criteo(config(tmp_path, days, train_days=[0, 1], eval_day=2), **SMALL)
    train = per_day[0] + per_day[1]
    vocab = ref_vocab(train, 3)
    check_split(out, "train", train, vocab)
    check_split(out, "val", per_day[2][:6], vocab)  # ceil(11 / 2) = 6
    check_split(out, "test", per_day[2][6:], vocab)
    with pytest.raises(ValueError, match="no file for day 5"):
        preprocess_criteo(config(tmp_path, days, train_days=[0, 5], eval_day=2), **SMALL)


def test_two_files_for_one_day_are_refused(tmp_path: Path) -> None:
    """day_1 next to day_1.gz (e.g. a decompressed copy, perhaps cut short): which rows are day 1
    is not clear, so nothing is read (day_1 was read and day_1.gz ignored without a word)."""
    days = tmp_path / "days"
    days.mkdir()
    write(days / "day_0", make_rows(12, seed=50))
    write(days / "day_1", make_rows(5, seed=51))
    write(days / "day_1.gz", make_rows(9, seed=52))
    write(days / "day_2", make_rows(6, seed=53))
    message = (
        f"{days}: 2 files for day 1 (day_1, day_1.gz); expected one: move the others out of "
        "the directory"
    )
    with pytest.raises(ValueError, match=f"^{re.escape(message)}$"):
        preprocess_criteo(config(tmp_path, days, train_days=[0, 1], eval_day=2), **SMALL)
    assert not (tmp_path / "out").exists()
    (days / "day_1").unlink()
    out = preprocess_criteo(config(tmp_path, days, train_days=[0, 1], eval_day=2), **SMALL)
    assert read_manifest(out)["splits"]["train"]["rows"] == 12 + 9


def test_a_training_day_named_twice_is_refused(tmp_path: Path) -> None:
    """train_days [0, 1, 1] (dmt-preprocess --train-days 0-1,1): day 1 was read once without a
    word, and the manifest's [0, 1, 1] then differed from the same rows asked as [0, 1]."""
    days = tmp_path / "days"
    days.mkdir()
    for d in range(3):
        write(days / f"day_{d}", make_rows(4, seed=55 + d))
    message = (
        "train_days [0, 1, 1] names day(s) [1] more than once; a day's rows are read once, so "
        "name each day once"
    )
    with pytest.raises(ValueError, match=f"^{re.escape(message)}$"):
        preprocess_criteo(config(tmp_path, days, train_days=[0, 1, 1], eval_day=2), **SMALL)
    assert not (tmp_path / "out").exists()


def test_terabyte_val_day_is_a_whole_day_between_train_and_test(tmp_path: Path) -> None:
    """The forward-in-time layout: train days, then a whole validation day, then the test day."""
    days = tmp_path / "days"
    days.mkdir()
    per_day = [make_rows(n, seed=20 + d) for d, n in enumerate([25, 18, 13, 9])]
    for d, rows in enumerate(per_day):
        write(days / f"day_{d}", rows)
    out = preprocess_criteo(
        config(tmp_path, days, train_days=[0, 1], val_day=2, eval_day=3), **SMALL
    )
    train = per_day[0] + per_day[1]
    vocab = ref_vocab(train, 3)
    check_split(out, "train", train, vocab)
    check_split(out, "val", per_day[2], vocab)  # all 13 rows of day 2, none of day 3
    check_split(out, "test", per_day[3], vocab)
    m = read_manifest(out)
    assert [m["splits"][s]["rows"] for s in ("train", "val", "test")] == [43, 13, 9]
    assert m["settings"]["layout"] == {
        "kind": "days",
        "train_days": [0, 1],
        "eval_day": 3,
        "val_day": 2,
    }


@pytest.mark.parametrize(
    "data,train_days,val_day,layout",
    [
        ("criteo_1tb_forward", 22, 22, {"val_day": 22}),
        ("criteo_1tb_forward_refit", 23, None, {"val_split": False}),
    ],
)
def test_criteo_1tb_forward_configs_split_by_day(
    tmp_path: Path, data: str, train_days: int, val_day: int | None, layout: dict[str, object]
) -> None:
    """On 24 tiny made-up days: data=criteo_1tb_forward trains on days 0-21, validates on day 22
    and tests on day 23; data=criteo_1tb_forward_refit trains on days 0-22, has no validation
    rows and tests on the same day 23, whole."""
    criteo = typed_config(f"data={data}", "data.criteo.raw_path=days").data.criteo
    assert criteo is not None
    days = tmp_path / "days"
    days.mkdir()
    per_day = [make_rows(3 + d % 4, seed=100 + d) for d in range(24)]
    for d, rows in enumerate(per_day):
        write(days / f"day_{d}", rows)
    out = preprocess_criteo(
        dataclasses.replace(
            criteo, raw_path=str(days), preprocessed_dir=str(tmp_path / "out"), num_workers=1
        ),
        **SMALL,
    )
    train = [row for rows in per_day[:train_days] for row in rows]
    val = per_day[val_day] if val_day is not None else []
    for split, rows in (("train", train), ("val", val), ("test", per_day[23])):
        dense, sparse, labels = load_split(out, split)
        assert sparse.shape == (len(rows), 26)
        ref = [ref_parse(r) for r in rows]
        np.testing.assert_array_equal(labels, [r[0] for r in ref])
        np.testing.assert_allclose(
            dense, np.array([r[1] for r in ref], np.float32).reshape(-1, 13), rtol=1e-6
        )
    m = read_manifest(out)
    assert [m["splits"][s]["rows"] for s in ("train", "val", "test")] == [
        len(train),
        len(val),
        len(per_day[23]),
    ]
    assert m["settings"]["layout"] == {
        "kind": "days",
        "train_days": list(range(train_days)),
        "eval_day": 23,
        **layout,
    }


def test_no_val_split_on_days_keeps_vocab_and_test_rows(tmp_path: Path) -> None:
    """val_split false: the vocabularies are fitted on the train days only and the test day is
    mapped through them whole, as with val_day."""
    days = tmp_path / "days"
    days.mkdir()
    per_day = [make_rows(n, seed=40 + d) for d, n in enumerate([25, 18, 9])]
    for d, rows in enumerate(per_day):
        write(days / f"day_{d}", rows)
    out = preprocess_criteo(
        config(tmp_path, days, train_days=[0, 1], eval_day=2, val_split=False), **SMALL
    )
    vocab = ref_vocab(per_day[0] + per_day[1], 3)
    check_split(out, "train", per_day[0] + per_day[1], vocab)
    check_split(out, "val", [], vocab)
    check_split(out, "test", per_day[2], vocab)


def test_no_val_split_on_one_file_needs_no_validation_fraction(tmp_path: Path) -> None:
    raw = tmp_path / "train.txt"
    write(raw, make_rows(20, seed=50))
    cfg = CriteoConfig(
        raw_path=str(raw),
        preprocessed_dir=str(tmp_path / "out"),
        split_fractions=[0.8, 0.1, 0.1],
        val_split=False,
    )
    message = (
        "val_split is false (no validation rows) but split_fractions [0.8, 0.1, 0.1] give "
        f"validation 0.1 of {str(raw)!r}; set split_fractions[1] to 0 (dmt-preprocess "
        "--split-fractions TRAIN 0 TEST)"
    )
    with pytest.raises(ValueError, match=f"^{re.escape(message)}$"):
        preprocess_criteo(cfg, **SMALL)
    assert not (tmp_path / "out").exists()
    out = preprocess_criteo(dataclasses.replace(cfg, split_fractions=[0.8, 0.0, 0.2]), **SMALL)
    assert read_manifest(out)["splits"]["val"]["rows"] == 0


@pytest.mark.parametrize("data", ["criteo_1tb_forward", "criteo_sample_forward"])
def test_split_settings_the_input_would_not_read_are_refused(tmp_path: Path, data: str) -> None:
    """data=criteo_1tb_forward on one file (the Terabyte day-0 head) and data=criteo_sample_forward
    on a directory of days: the split they name (days 0-21/22/23, fractions 80/10/10) is not the
    one the input gets, so preprocessing stops, as dmt-preprocess refuses those options there;
    a directory made without them and read as it is (auto_preprocess=false) is warned about."""
    if data == "criteo_1tb_forward":
        raw = write(tmp_path / "day_0.tsv", make_rows(20, seed=60))
        unread, kinds = f"train_days {list(range(22))}, val_day 22", ("fractions", "days")
        message = (
            f"{unread} apply only to a directory of days, but raw_path {str(raw)!r} is one "
            "file, which split_fractions [0.85, 0.075, 0.075] cut instead: they would be "
            "ignored; set raw_path to the directory of day_<d> files, or leave train_days, "
            "val_day and eval_day at their defaults"
        )
    else:
        raw = tmp_path / "days"
        raw.mkdir()
        for d in range(24):
            write(raw / f"day_{d}", make_rows(3, seed=60 + d))
        unread, kinds = "split_fractions [0.8, 0.1, 0.1]", ("days", "fractions")
        message = (
            f"{unread} applies only to one input file, but raw_path {str(raw)!r} is a directory "
            "of days, which train_days, val_day and eval_day split instead: it would be "
            "ignored; set raw_path to one file, or leave split_fractions at its default"
        )
    cfg = typed_config(f"data={data}", f"data.criteo.raw_path={raw}").data.criteo
    assert cfg is not None
    cfg = dataclasses.replace(cfg, preprocessed_dir=str(tmp_path / "out"), num_workers=1)
    with pytest.raises(ValueError, match=f"^{re.escape(message)}$"):
        preprocess_criteo(cfg, **SMALL)
    assert not (tmp_path / "out").exists()
    made = dataclasses.replace(
        cfg, split_fractions=[0.85, 0.075, 0.075], train_days=list(range(23)), val_day=None
    )
    manifest = read_manifest(preprocess_criteo(made, **SMALL))
    assert settings_differences(cfg, manifest) == [
        f"layout.kind: {kinds[0]!r} there, {kinds[1]!r} asked ({unread})"
    ]


def test_terabyte_without_val_day_keeps_the_halving_layout(tmp_path: Path) -> None:
    """val_day None writes the settings of outputs made before it existed (same settings hash,
    so their outputs stay up to date)."""
    days = tmp_path / "days"
    days.mkdir()
    write(days / "day_0", make_rows(12, seed=30))
    write(days / "day_1", make_rows(7, seed=31))
    m = read_manifest(
        preprocess_criteo(config(tmp_path, days, train_days=[0], eval_day=1), **SMALL)
    )
    assert m["settings"]["layout"] == {"kind": "days", "train_days": [0], "eval_day": 1}
    assert [m["splits"][s]["rows"] for s in ("train", "val", "test")] == [12, 4, 3]
    day_0, day_1 = str((days / "day_0").resolve()), str((days / "day_1").resolve())
    assert [m["splits"][s]["source_lines"] for s in ("train", "val", "test")] == [
        [{"path": day_0, "first_line": 1, "last_line": 12}],
        [{"path": day_1, "first_line": 1, "last_line": 4}],
        [{"path": day_1, "first_line": 5, "last_line": 7}],
    ]


def test_the_manifest_names_the_lines_of_each_split(tmp_path: Path) -> None:
    """``source_lines``: 1-based, inclusive line ranges of the input, one block per split."""
    raw = write(tmp_path / "train.txt", make_rows(10, seed=4))
    m = read_manifest(
        preprocess_criteo(config(tmp_path, raw, split_fractions=[0.6, 0.3, 0.1]), **SMALL)
    )
    path = str(raw.resolve())
    assert [m["splits"][s]["source_lines"] for s in ("train", "val", "test")] == [
        [{"path": path, "first_line": 1, "last_line": 6}],
        [{"path": path, "first_line": 7, "last_line": 9}],
        [{"path": path, "first_line": 10, "last_line": 10}],
    ]
    cfg = config(tmp_path, raw, split_fractions=[0.7, 0.0, 0.3])
    cfg = dataclasses.replace(cfg, preprocessed_dir=str(tmp_path / "no_val"))
    m = read_manifest(preprocess_criteo(cfg, **SMALL))
    assert [m["splits"][s]["source_lines"] for s in ("train", "val", "test")] == [
        [{"path": path, "first_line": 1, "last_line": 7}],
        [],
        [{"path": path, "first_line": 8, "last_line": 10}],
    ]


@pytest.mark.parametrize(
    "settings,message",
    [
        (
            {"train_days": [0, 1, 2], "val_day": 2, "eval_day": 3},
            "val_day 2 is also in train_days [0, 1, 2]; validation rows must not be trained on",
        ),
        (
            {"train_days": [0, 1], "val_day": 3, "eval_day": 3},
            "val_day 3 equals eval_day 3; the validation day must be another day than the test "
            "day (or val_day None, to halve eval_day)",
        ),
        (
            {"train_days": [0, 1], "val_day": 2, "eval_day": 3, "val_split": False},
            "val_split is false (no validation rows) but val_day 2 is set; set val_day to null, "
            "and put day 2 into train_days to train on it",
        ),
    ],
)
def test_val_day_errors_name_the_settings(settings: dict[str, object], message: str) -> None:
    cfg = CriteoConfig(raw_path="days", preprocessed_dir="out", **settings)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=f"^{re.escape(message)}$"):
        cfg.validate()


def test_workers_and_block_sizes_give_identical_output(tmp_path: Path) -> None:
    raw = write(tmp_path / "train.txt", make_rows(500, seed=5))
    a = preprocess_criteo(
        CriteoConfig(raw_path=str(raw), preprocessed_dir=str(tmp_path / "a"), num_workers=1),
        progress=False,
    )
    b = preprocess_criteo(
        CriteoConfig(raw_path=str(raw), preprocessed_dir=str(tmp_path / "b"), num_workers=2),
        **SMALL,
    )
    files = sorted(p.relative_to(a) for p in a.rglob("*") if p.is_file())
    assert files == sorted(p.relative_to(b) for p in b.rglob("*") if p.is_file())
    for f in files:
        assert (a / f).read_bytes() == (b / f).read_bytes(), f


def test_rerun_is_a_noop_and_settings_changes_need_overwrite(tmp_path: Path) -> None:
    raw = write(tmp_path / "train.txt", make_rows(50, seed=6))
    cfg = config(tmp_path, raw)
    out = preprocess_criteo(cfg, **SMALL)
    stamp = (out / "manifest.json").stat().st_mtime_ns
    preprocess_criteo(cfg, **SMALL)
    assert (out / "manifest.json").stat().st_mtime_ns == stamp
    cfg.frequency_threshold = 1
    with pytest.raises(ValueError, match="other settings"):
        preprocess_criteo(cfg, **SMALL)
    preprocess_criteo(cfg, overwrite=True, **SMALL)
    assert read_manifest(out)["settings"]["categorical"]["frequency_threshold"] == 1
    rows = raw.read_text().splitlines()
    check_split(out, "train", rows[:42], ref_vocab(rows[:42], 1))  # same process, new vocabularies
    assert not list(tmp_path.glob(".out.*"))


def test_the_refusal_names_what_changed_since_the_output_was_made(tmp_path: Path) -> None:
    """A stale output's refusal names the setting or the input file's field that differs, not
    just "other settings or sources" (a data file copied to a cluster's scratch disk keeps its
    rows but not its modification time)."""
    raw = write(tmp_path / "train.txt", make_rows(50, seed=7))
    cfg = config(tmp_path, raw)
    out = preprocess_criteo(cfg, **SMALL)
    prefix = f"output directory {str(out)!r} exists and was made with other settings or sources"
    suffix = "; pass overwrite=True (--overwrite) to replace it or choose another directory"
    named = f"input file 0 {str(raw.resolve())!r}"

    os.utime(raw, ns=(0, 86_400 * 10**9))  # 1970-01-02, contents unchanged
    cfg.frequency_threshold = 1  # refused for the setting; alone, the new time is no reason
    with pytest.raises(ValueError) as err:
        preprocess_criteo(cfg, **SMALL)
    ns = read_manifest(out)["sources"][0]["mtime_ns"]
    made = f"{datetime.datetime.fromtimestamp(ns // 10**9, datetime.UTC):%Y-%m-%d %H:%M:%S}"
    made += f".{ns % 10**9:09d}"
    assert str(err.value) == (
        f"{prefix} (categorical.frequency_threshold: 3 there, 1 asked; {named}: modified {made} "
        "UTC there, 1970-01-02 00:00:00.000000000 UTC now, same size and sampled fingerprint: "
        f"touched or copied since, perhaps with the same rows){suffix}"
    )

    cfg.frequency_threshold = 3
    cfg.split_fractions = [0.8, 0.1, 0.1]
    cfg.skip_bad_rows = True
    with raw.open("a") as f:
        f.write(make_rows(1, seed=8)[0] + "\n")
    with pytest.raises(ValueError) as err:
        preprocess_criteo(cfg, **SMALL)
    size = raw.stat().st_size
    assert str(err.value).startswith(
        f"{prefix} (layout.split_fractions: [0.85, 0.075, 0.075] there, [0.8, 0.1, 0.1] asked; "
        f"skip_bad_rows: False there, True asked; {named}: size "
        f"{size - len(make_rows(1, seed=8)[0]) - 1} there, {size} now, modified "
    ), str(err.value)
    message = str(err.value)
    assert message.endswith(f" now, sampled fingerprint differs){suffix}")
    assert "missing_id" not in message  # recorded only when distinct: not a difference


def test_inputs_that_only_moved_or_were_touched_are_the_same_rows(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A reproduced bug: an output whose input files were moved, copied or only touched since
    (their size, gzip flag and sampled fingerprint the recorded ones) was refused as "made with
    other settings or sources", and training on it (data.criteo.auto_preprocess, the same
    preprocessed_dir) stopped, a resume on moved data too. It is used as it is, with a warning
    that names each file and what changed; a file whose rows changed is refused as before, and
    ``overwrite`` rebuilds it from the files where they are now."""
    days = tmp_path / "days"
    days.mkdir()
    write(days / "day_0", make_rows(30, seed=40))
    write(days / "day_1.gz", make_rows(20, seed=41))
    write(days / "day_2.tsv", make_rows(11, seed=42))
    names = ["day_0", "day_1.gz", "day_2.tsv"]
    for name in names:
        os.utime(days / name, ns=(0, 86_400 * 10**9))  # 1970-01-02 00:00:00
    cfg = config(tmp_path, days, train_days=[0, 1], eval_day=2)
    out = preprocess_criteo(cfg, **SMALL)
    made = tree(out)
    day = "1970-01-0{} 00:00:00.000000000 UTC"
    rows = (
        "but each still has the recorded size and sampled fingerprint (sha256 of its size, first "
        "MiB and last MiB), taken as the same rows; if a file changed between those MiB, rebuild "
        "it with overwrite=True (--overwrite)"
    )

    def warned(*changes: str) -> str:
        return (
            f"{out} is used as it is: its input files moved or were modified since it was made "
            f"({'; '.join(changes)}), {rows}"
        )

    os.utime(days / "day_1.gz", ns=(0, 2 * 86_400 * 10**9))  # touched
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="dmt.data.criteo_preprocess"):
        assert preprocess_criteo(cfg, **SMALL) == out
    assert tree(out) == made
    path = str(days / "day_1.gz")
    assert caplog.messages == [
        warned(f"input file 1 {path!r}: modified {day.format(2)} there, {day.format(3)} now")
    ]

    moved = tmp_path / "scratch" / "days"  # the directory moved (renamed), then copied
    moved.parent.mkdir()
    days.rename(moved)
    copy = tmp_path / "copy"
    copy.mkdir()
    for name in names:
        (copy / name).write_bytes((moved / name).read_bytes())
        os.utime(copy / name, ns=(0, 4 * 86_400 * 10**9))
    for where, times in ((moved, (2, 3, 2)), (copy, (5, 5, 5))):  # day 2 recorded
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="dmt.data.criteo_preprocess"):
            here = dataclasses.replace(cfg, raw_path=str(where))
            assert preprocess_criteo(here, **SMALL) == out
        assert tree(out) == made
        changes = []
        for i, (name, t) in enumerate(zip(names, times)):
            change = f"input file {i} {str(where / name)!r}: path {str(days / name)!r} there, "
            change += f"{str(where / name)!r} now"
            if t != 2:
                change += f", modified {day.format(2)} there, {day.format(t)} now"
            changes.append(change)
        assert caplog.messages == [warned(*changes)]

    # other rows of the same size: refused as before, naming the file
    text = (copy / "day_0").read_text()
    flipped = ("1" if text[0] == "0" else "0") + text[1:]
    (copy / "day_0").write_text(flipped)
    here = dataclasses.replace(cfg, raw_path=str(copy))
    with pytest.raises(ValueError) as err:
        preprocess_criteo(here, **SMALL)
    assert (
        f"input file 0 {str(copy / 'day_0')!r}: path {str(days / 'day_0')!r} there, "
        f"{str(copy / 'day_0')!r} now, modified {day.format(2)} there, "
    ) in str(err.value)
    assert str(err.value).startswith(
        f"output directory {str(out)!r} exists and was made with other settings or sources ("
    )
    assert ", sampled fingerprint differs; input file 1 " in str(err.value)
    assert tree(out) == made
    (copy / "day_0").write_text(text)

    # overwrite: rebuilt from the files where they are now (the same arrays)
    caplog.clear()
    preprocess_criteo(dataclasses.replace(cfg, raw_path=str(moved)), overwrite=True, **SMALL)
    assert not caplog.messages
    assert [s["path"] for s in read_manifest(out)["sources"]] == [str(moved / n) for n in names]
    assert {k: v for k, v in tree(out).items() if k != "manifest.json"} == {
        k: v for k, v in made.items() if k != "manifest.json"
    }


def test_transform_tsv_uses_training_vocabularies(tmp_path: Path) -> None:
    rows = make_rows(200, seed=7)
    raw = write(tmp_path / "train.txt", rows)
    out = preprocess_criteo(config(tmp_path, raw), **SMALL)
    extra_rows = make_rows(40, seed=8, pool=30)  # partly unseen values
    extra = write(tmp_path / "extra.tsv.gz", extra_rows)
    t = transform_tsv(out, extra, progress=False, block_bytes=700)
    check_split(t, "test", extra_rows, ref_vocab(rows[:170], 3))
    m = read_manifest(t)
    assert m["cardinalities"] == read_manifest(out)["cardinalities"]
    assert m["splits"]["test"]["rows"] == 40
    assert transform_tsv(out, extra, progress=False) == t  # no-op
    assert t.parent == out.parent and t.name.startswith("out.extra.tsv.gz-")  # beside it
    # the directory given as "." (its own working directory): still beside it, the same output
    # (a reproduced bug: it went inside, a foreign entry that blocked --overwrite there)
    before = sorted(p.name for p in out.iterdir())
    with pytest.MonkeyPatch.context() as patch:
        patch.chdir(out)
        assert transform_tsv(".", extra, progress=False) == t
    assert sorted(p.name for p in out.iterdir()) == before
    # a transform output has no vocabularies to lend; a damaged parent says what is damaged
    with pytest.raises(ValueError) as err:
        transform_tsv(t, extra, out_dir=tmp_path / "t2", progress=False)
    assert str(err.value) == (
        f"{str(t)!r} has no vocabularies of its own: it was made through those of "
        f"{str(out.resolve())!r}; give that directory"
    )
    (out / "vocab" / "cat_3.npy").unlink()
    with pytest.raises(ValueError) as err:
        transform_tsv(out, extra, out_dir=tmp_path / "t3", progress=False)
    assert str(err.value).startswith(f"{str(out)!r} cannot lend its vocabularies: ")
    assert "cat_3.npy" in str(err.value)
    assert not (tmp_path / "t2").exists() and not (tmp_path / "t3").exists()


def test_a_transformed_file_that_only_moved_or_was_touched_is_not_transformed_again(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A reproduced bug: a file given to transform_tsv without ``out_dir`` (data.criteo.test_path,
    dmt-eval --data FILE) that moved, was copied or only touched since was transformed again into
    a new directory beside the vocabularies (its default name hashes its path and modification
    time). The earlier output is used as it is, with the warning a moved raw_path gives; a file
    whose rows changed is transformed again, and ``overwrite`` transforms the file anew."""
    out = preprocess_criteo(
        config(tmp_path, write(tmp_path / "train.txt", make_rows(200))), **SMALL
    )
    extra_rows = make_rows(40, seed=8, pool=30)
    extra = write(tmp_path / "extra.tsv", extra_rows)
    os.utime(extra, ns=(0, 86_400 * 10**9))  # 1970-01-02 00:00:00
    t = transform_tsv(out, extra, progress=False)
    made = tree(t)
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith("out.")) == [t.name]
    day = "1970-01-0{} 00:00:00.000000000 UTC"
    rows = (
        "but each still has the recorded size and sampled fingerprint (sha256 of its size, first "
        "MiB and last MiB), taken as the same rows; if a file changed between those MiB, rebuild "
        "it with overwrite=True (--overwrite)"
    )

    moved = tmp_path / "elsewhere" / "extra.tsv"  # moved, then touched; then copied, renamed
    moved.parent.mkdir()
    extra.rename(moved)
    copy = tmp_path / "elsewhere" / "day_24.tsv"
    for path, change in (
        (moved, ""),
        (moved, f", modified {day.format(2)} there, {day.format(3)} now"),
        (copy, f", modified {day.format(2)} there, {day.format(4)} now"),
    ):
        if path == copy:
            copy.write_bytes(moved.read_bytes())
            os.utime(copy, ns=(0, 3 * 86_400 * 10**9))
        elif change:
            os.utime(moved, ns=(0, 2 * 86_400 * 10**9))
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="dmt.data.criteo_preprocess"):
            assert transform_tsv(out, path, progress=False) == t
        assert caplog.messages == [
            f"{t} is used as it is: its input files moved or were modified since it was made "
            f"(input file 0 {str(path)!r}: path {str(extra)!r} there, {str(path)!r} now{change})"
            f", {rows}, or delete it where dmt made it beside the preprocessed directory "
            "(data.criteo.test_path and dmt-eval --data FILE have no overwrite)"
        ]
        assert tree(t) == made
        assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith("out.")) == [t.name]

    # other rows of the same size: transformed again, into a new directory, never the stale one
    text = copy.read_text()
    copy.write_text(("1" if text[0] == "0" else "0") + text[1:])
    changed = transform_tsv(out, copy, progress=False)
    assert changed != t and changed.parent == t.parent and tree(t) == made
    check_split(changed, "test", copy.read_text().splitlines(), ref_vocab(make_rows(200)[:170], 3))
    # overwrite: the moved file transformed anew, into its own default directory
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="dmt.data.criteo_preprocess"):
        again = transform_tsv(out, moved, overwrite=True, progress=False)
    assert again not in (t, changed) and not caplog.messages
    assert read_manifest(again)["sources"][0]["path"] == str(moved)
    check_split(again, "test", extra_rows, ref_vocab(make_rows(200)[:170], 3))


def test_a_moved_file_does_not_reuse_an_output_directory_its_caller_named(
    tmp_path: Path,
) -> None:
    """A reproduced bug: a moved file given without ``out_dir`` reused any earlier output of its
    rows beside the vocabularies, one that a caller had named itself (``out_dir``, --output)
    included, where transform_tsv reuses only the output of an earlier call without ``out_dir``
    (its default name); that directory is left as it was."""
    out = preprocess_criteo(
        config(tmp_path, write(tmp_path / "train.txt", make_rows(200))), **SMALL
    )
    extra_rows = make_rows(40, seed=8, pool=30)
    extra = write(tmp_path / "extra.tsv", extra_rows)
    named = transform_tsv(out, extra, tmp_path / "out.mine", progress=False)
    made = tree(named)
    moved = tmp_path / "moved.tsv"
    extra.rename(moved)
    t = transform_tsv(out, moved, progress=False)
    assert t.parent == tmp_path and t.name.startswith("out.moved.tsv-") and tree(named) == made
    assert read_manifest(t)["sources"][0]["path"] == str(moved)
    check_split(t, "test", extra_rows, ref_vocab(make_rows(200)[:170], 3))


def test_an_output_used_after_its_inputs_moved_logs_the_settings_hash_it_records(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A reproduced bug: an output used as it is after its input files moved (or were touched)
    was logged "is up to date (settings hash H)" with H the hash of the files where they are now,
    which its manifest.json (and a transform's directory name) does not hold. The line names the
    recorded hash, and says why the inputs' hash differs now."""
    raw = write(tmp_path / "train.txt", make_rows(200))
    out = preprocess_criteo(config(tmp_path, raw), **SMALL)
    extra = write(tmp_path / "extra.tsv", make_rows(40, seed=8, pool=30))
    t = transform_tsv(out, extra, progress=False)
    moved_raw = raw.rename(tmp_path / "moved.txt")
    moved_extra = extra.rename(tmp_path / "moved.tsv")
    for made, again in (
        (out, lambda: preprocess_criteo(config(tmp_path, moved_raw), **SMALL)),
        (t, lambda: transform_tsv(out, moved_extra, progress=False)),
    ):
        recorded = read_manifest(made)["settings_hash"]
        caplog.clear()
        with caplog.at_level(logging.INFO, logger="dmt.data.criteo_preprocess"):
            assert again() == made
        [line] = [m for m in caplog.messages if "up to date" in m]
        now = re.fullmatch(
            f"{re.escape(str(made))} is up to date \\(settings hash {recorded[:12]} in its "
            "manifest.json; ([0-9a-f]{12}) where its inputs are now: its input files moved or "
            "were touched since\\)",
            line,
        )
        assert now is not None and now[1] != recorded[:12], line
    assert t.name.endswith(f"-{read_manifest(t)['settings_hash'][:10]}")


def test_a_moved_preprocessed_directory_keeps_its_transformed_files(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A reproduced bug: a preprocessed directory moved with the transform_tsv outputs cached
    beside it (data.criteo.test_path, dmt-eval --data FILE) had each file transformed again
    there, and an output directory named by the caller was refused as made with other settings
    (the vocabularies' path is in a transform's settings hash). The same vocabularies (their
    settings hash) read the earlier outputs; other vocabularies, settings or rows do not."""
    raw = write(tmp_path / "train.txt", make_rows(200))
    out = preprocess_criteo(config(tmp_path / "data", raw), **SMALL)
    extra_rows = make_rows(40, seed=8, pool=30)
    extra = write(tmp_path / "extra.tsv", extra_rows)
    t = transform_tsv(out, extra, progress=False)
    named = transform_tsv(out, extra, tmp_path / "data" / "mine", progress=False)
    made, made_named = tree(t), tree(named)
    (tmp_path / "scratch").mkdir()
    data = (tmp_path / "data").rename(tmp_path / "scratch" / "data")
    here = data / "out"
    vocab_hash = read_manifest(here)["settings_hash"]
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="dmt.data.criteo_preprocess"):
        assert transform_tsv(here, extra, progress=False) == data / t.name
        assert transform_tsv(here, extra, data / "mine", progress=False) == data / "mine"
    assert tree(data / t.name) == made and tree(data / "mine") == made_named
    assert sorted(p.name for p in data.iterdir()) == sorted(["out", t.name, "mine"])
    lines = [m for m in caplog.messages if "up to date" in m]
    assert len(lines) == 2
    for d, line in zip((t, named), lines):
        recorded = read_manifest(data / d.name)["settings_hash"]
        assert re.fullmatch(
            f"{re.escape(str(data / d.name))} is up to date \\(settings hash {recorded[:12]} in "
            "its manifest.json; [0-9a-f]{12} where its inputs are now: it was made through the "
            f"vocabularies in {re.escape(repr(str(out)))}, the same \\(settings hash "
            f"{vocab_hash[:12]}\\) as those now in {re.escape(repr(str(here)))}\\)",
            line,
        ), line
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]
    vocab = ref_vocab(make_rows(200)[:170], 3)
    check_split(data / t.name, "test", extra_rows, vocab)

    # other settings, other rows, other vocabularies: transformed anew, the cached one kept
    other = transform_tsv(here, extra, skip_bad_rows=True, progress=False)
    assert other.parent == data and other.name not in (t.name, "mine")
    check_split(other, "test", extra_rows, vocab)
    text = extra.read_text()
    extra.write_text(("1" if text[0] == "0" else "0") + text[1:])
    changed = transform_tsv(here, extra, progress=False)
    assert changed.parent == data and changed not in (data / t.name, other)
    check_split(changed, "test", extra.read_text().splitlines(), vocab)
    extra.write_text(text)
    preprocess_criteo(config(data, raw, frequency_threshold=2), overwrite=True, **SMALL)
    rebuilt = transform_tsv(here, extra, progress=False)
    assert rebuilt.parent == data and rebuilt not in (data / t.name, other, changed)
    check_split(rebuilt, "test", extra_rows, ref_vocab(make_rows(200)[:170], 2))
    assert tree(data / t.name) == made


# -- bad input --------------------------------------------------------------------------------

GOOD = make_rows(40, seed=9)


def _replace(line: str, field: int, value: str) -> str:
    f = line.split("\t")
    f[field] = value
    return "\t".join(f)


BAD_ROWS = {
    # a labelled row short of its last field reads as one without its label too: either
    "too few fields": ("\t".join(GOOD[0].split("\t")[:39]), "found 39 tab-separated field(s); one field is missing: the label column, as in Criteo's Kaggle test.txt, whose labels Criteo never published (dmt trains and scores labelled rows only), or another; expected 40"),
    # Kaggle's test.txt: no label column (reproduced: only "found 39 ... field(s)" was said)
    "no label column": ("\t".join(GOOD[0].split("\t")[1:]), "found 39 tab-separated field(s); the label column is missing, as in Criteo's Kaggle test.txt, whose labels Criteo never published (dmt trains and scores labelled rows only); expected 40"),
    "too many fields": (GOOD[0] + "\t", "found 41 tab-separated field"),
    "empty line": ("", "found 1 tab-separated field"),
    "float dense": (_replace(GOOD[0], 3, "1.5"), "I3 is '1.5'; expected a decimal integer"),
    "word dense": (_replace(GOOD[0], 13, "abc"), "I13 is 'abc'; expected a decimal integer"),
    "lone minus": (_replace(GOOD[0], 1, "-"), "I1 is '-'; expected a decimal integer"),
    "plus sign": (_replace(GOOD[0], 2, "+3"), "I2 is '+3'"),
    "long non-digit": (_replace(GOOD[0], 4, "1234567890x"), "I4 is '1234567890x'"),
    "non-hex category": (_replace(GOOD[0], 18, "zz00ff00"), "C5 is 'zz00ff00'; expected up to 8 hexadecimal"),
    "9 hex digits": (_replace(GOOD[0], 14, "123456789"), "C1 is '123456789'"),
    "bad label": (_replace(GOOD[0], 0, "2"), "label is '2'; expected 0 or 1"),
    "empty label": (_replace(GOOD[0], 0, ""), "label is ''; expected 0 or 1"),
    # a control character: its field and what that holds (reproduced: neither was named)
    "control char": (_replace(GOOD[0], 20, "00\x0000ff"), "C7 contains the control character b'\\x00'; expected up to 8 hexadecimal digits"),
    "control char in dense": (_replace(GOOD[0], 3, "1\x0b2"), "I3 contains the control character b'\\x0b'; expected a decimal integer"),
    # a control character in place of a tab: still 40 fields if it were read as a delimiter
    "control char for a tab": ("\t".join(GOOD[0].split("\t")[:20]) + "\x01" + "\t".join(GOOD[0].split("\t")[20:]), "C6 contains the control character b'\\x01'; expected up to 8 hexadecimal digits"),
    "carriage return": (GOOD[0] + "\r", "C26 ends with the control character b'\\r', a Windows (CRLF) line ending; expected lines that end in b'\\n' alone: convert the file first (dos2unix, or sed -i 's/\\r$//')"),
}  # fmt: skip


@pytest.mark.parametrize("case", sorted(BAD_ROWS))
def test_bad_rows(tmp_path: Path, case: str) -> None:
    bad, expected = BAD_ROWS[case]
    assert describe_row_problem(bad.encode()) is not None
    rows = GOOD[:30] + [bad] + GOOD[30:]
    raw = write(tmp_path / "train.txt", rows)
    with pytest.raises(
        CriteoFormatError, match=re.escape(f"{raw.resolve()}:31: ") + ".*" + re.escape(expected)
    ):
        preprocess_criteo(config(tmp_path, raw), **SMALL)
    assert not (tmp_path / "out").exists() and not list(tmp_path.glob(".out.*"))

    out = preprocess_criteo(config(tmp_path, raw, skip_bad_rows=True), **SMALL)
    m = read_manifest(out)
    assert m["bad_rows"]["total"] == 1
    assert m["bad_rows"]["examples"][0].startswith(f"{raw.resolve()}:31: ")
    # 41 lines: train = first 35 lines minus the bad one
    assert m["splits"]["train"]["bad_rows"] == 1
    assert [m["splits"][s]["rows"] for s in ("train", "val", "test")] == [34, 3, 3]
    good_train = [r for r in rows[:35] if r is not bad]
    check_split(out, "train", good_train, ref_vocab(good_train, 3))
    check_split(out, "test", rows[38:], ref_vocab(good_train, 3))


def test_bad_rows_in_many_ranges_are_compacted(tmp_path: Path) -> None:
    rows = make_rows(300, seed=11)
    bad_at = {3, 50, 51, 150, 299}
    mixed = [("x\t" + r) if i in bad_at else r for i, r in enumerate(rows)]
    raw = write(tmp_path / "train.txt", mixed)
    with pytest.raises(ValueError, match=re.escape(f"{raw.resolve()}:4: found 41")):
        preprocess_criteo(config(tmp_path, raw), **SMALL)
    out = preprocess_criteo(config(tmp_path, raw, skip_bad_rows=True), **SMALL)
    m = read_manifest(out)
    assert m["bad_rows"]["total"] == 5
    assert [e.split(": ")[0].rsplit(":", 1)[1] for e in m["bad_rows"]["examples"]] == [
        "4", "51", "52", "151", "300"
    ]  # fmt: skip
    kept = [r for i, r in enumerate(rows) if i not in bad_at]
    vocab = ref_vocab([r for i, r in enumerate(rows[:255]) if i not in bad_at], 3)
    check_split(out, "train", [r for i, r in enumerate(rows[:255]) if i not in bad_at], vocab)
    check_split(out, "val", rows[255:278], vocab)
    check_split(out, "test", [r for i, r in enumerate(rows) if i >= 278 and i not in bad_at], vocab)
    assert sum(m["splits"][s]["rows"] for s in m["splits"]) == len(kept)
    for split, (lo, hi) in {"train": (0, 255), "val": (255, 278), "test": (278, 300)}.items():
        labels = [int(r[0]) for i, r in enumerate(rows[lo:hi], lo) if i not in bad_at]
        assert m["splits"][split]["click_rate"] == pytest.approx(sum(labels) / len(labels))


def test_an_all_empty_feature_costs_the_rows_the_readme_says(tmp_path: Path) -> None:
    """Reproduced: the README told users to leave unused fields empty, as costing one embedding
    row; in hash mode (``criteo_1tb``'s, which it names for directories of days) such a table has
    its whole ``hash_sizes`` entry, 40M rows there."""
    rows = [_replace(r, 39, "") for r in make_rows(60, seed=30)]  # C26 always empty
    raw = write(tmp_path / "train.txt", rows)
    settings: dict[str, dict[str, object]] = {
        "vocab": {},
        "distinct": {"missing_id": "distinct"},
        "hash": {"categorical_mode": "hash", "hash_sizes": [50]},
        "hash, per feature": {"categorical_mode": "hash", "hash_sizes": [50] * 25 + [2]},
    }
    rows_of_c26 = {}
    for k, (name, kw) in enumerate(settings.items()):
        cfg = CriteoConfig(
            raw_path=str(raw), preprocessed_dir=str(tmp_path / f"out{k}"), num_workers=1, **kw
        )  # type: ignore[arg-type]
        rows_of_c26[name] = read_manifest(preprocess_criteo(cfg, **SMALL))["cardinalities"][25]
    assert rows_of_c26 == {"vocab": 1, "distinct": 2, "hash": 50, "hash, per feature": 2}
    assert typed_config("data=criteo_1tb").data.criteo.hash_sizes == [40_000_000]
    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    assert (
        "leave unused fields empty (an all-empty feature costs one embedding row in vocab mode, "
        "two with `missing_id=distinct`, but its whole `hash_sizes` entry in hash mode, "
        "`criteo_1tb`'s 40M: give it 2 among 26 per-feature sizes)"
    ) in " ".join(readme.split())


def test_empty_file(tmp_path: Path) -> None:
    days = tmp_path / "days"
    days.mkdir()
    write(days / "day_0", make_rows(20, seed=12))
    (days / "day_1").write_text("")
    write(days / "day_2", make_rows(6, seed=13))
    cfg = config(tmp_path, days, train_days=[0, 1], eval_day=2)
    with pytest.raises(
        ValueError, match=re.escape(f"{(days / 'day_1').resolve()}:1: the file is empty")
    ):
        preprocess_criteo(cfg, **SMALL)
    cfg.skip_bad_rows = True
    m = read_manifest(preprocess_criteo(cfg, **SMALL))
    assert m["empty_files"] == [str((days / "day_1").resolve())]
    assert m["splits"]["train"]["rows"] == 20
    single = write(tmp_path / "empty.txt", [], trailing_newline=False)
    with pytest.raises(ValueError, match="empty.txt:1: the file is empty"):
        preprocess_criteo(
            CriteoConfig(raw_path=str(single), preprocessed_dir=str(tmp_path / "o2")), **SMALL
        )


def test_truncated_gzip(tmp_path: Path) -> None:
    rows = make_rows(400, seed=14)
    data = gzip.compress(("\n".join(rows) + "\n").encode())
    raw = tmp_path / "train.txt.gz"
    raw.write_bytes(data[: len(data) // 2])
    partial = zlib.decompressobj(wbits=31).decompress(data[: len(data) // 2])
    complete = partial.count(b"\n")
    assert 0 < complete < 400
    with pytest.raises(
        CriteoFormatError,
        match=re.escape(f"{raw.resolve()}:{complete + 1}: the gzip stream ends unexpectedly"),
    ):
        preprocess_criteo(config(tmp_path, raw), **SMALL)
    out = preprocess_criteo(config(tmp_path, raw, skip_bad_rows=True), **SMALL)
    m = read_manifest(out)
    assert m["truncated_files"] == [{"path": str(raw.resolve()), "complete_lines": complete}]
    assert sum(m["splits"][s]["rows"] for s in m["splits"]) == complete
    b1 = round(complete * 0.85)
    check_split(out, "train", rows[:b1], ref_vocab(rows[:b1], 3))


def test_manifest_is_plain_json(tmp_path: Path) -> None:
    raw = write(tmp_path / "train.txt", make_rows(30, seed=15))
    out = preprocess_criteo(config(tmp_path, raw), **SMALL)
    m = json.loads((out / "manifest.json").read_text())
    assert m["sources"][0]["lines"] == 30 and len(m["sources"][0]["fingerprint"]) == 64
    assert m["sparse_features"] == [f"cat_{i}" for i in range(26)]
    assert m["splits"]["train"]["files"]["dense"] == "train/dense.npy"


def test_corrupt_gzip(tmp_path: Path) -> None:
    data = bytearray(gzip.compress(("\n".join(make_rows(300, seed=16)) + "\n").encode()))
    data[len(data) // 2 : len(data) // 2 + 64] = bytes(64)
    raw = tmp_path / "train.txt.gz"
    raw.write_bytes(bytes(data))
    with pytest.raises(
        CriteoFormatError, match=re.escape(str(raw.resolve())) + r":\d+: cannot decompress"
    ):
        preprocess_criteo(config(tmp_path, raw, skip_bad_rows=True), **SMALL)


def test_corrupt_gzip_names_the_line_where_decoding_stopped(tmp_path: Path) -> None:
    """A reproduced bug: the error named the first line of the read (16 MiB of text) in which
    the stream broke, line 1 here; it names the first line not decoded, after the first member's
    1,000."""
    rows = make_rows(1000, seed=17)
    second = bytearray(gzip.compress(("\n".join(make_rows(300, seed=18)) + "\n").encode()))
    second[len(second) // 2 : len(second) // 2 + 64] = bytes(64)
    raw = tmp_path / "two.gz"
    raw.write_bytes(gzip.compress(("\n".join(rows) + "\n").encode()) + bytes(second))
    with pytest.raises(CriteoFormatError, match=re.escape(f"{raw}:1001: cannot decompress")):
        for _ in iter_line_blocks(str(raw)):
            pass


def test_zero_padding_after_a_gzip_member_is_read_as_gzip_reads_it(tmp_path: Path) -> None:
    """gzip and Python's gzip module skip zero bytes after a member (tape padding); so does
    the reader (a reproduced bug: "incorrect header check" at line 1)."""
    rows = make_rows(50, seed=19)
    raw = tmp_path / "pad.gz"
    raw.write_bytes(
        gzip.compress(("\n".join(rows[:20]) + "\n").encode())
        + bytes(100)
        + gzip.compress(("\n".join(rows[20:]) + "\n").encode())
        + bytes(512)
    )
    assert gzip.decompress(raw.read_bytes()).decode().splitlines() == rows
    lines = sum(n for _, _, n in iter_line_blocks(str(raw)))
    assert lines == 50


# -- safe outputs: what --overwrite may replace, empty and damaged outputs --------------------


def tree(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in root.rglob("*") if p.is_file()}


def test_overwrite_never_replaces_a_directory_holding_the_input(tmp_path: Path) -> None:
    """Bug: ``--overwrite`` deleted the output directory with the raw file inside it."""
    data = tmp_path / "data"
    data.mkdir()
    raw = write(data / "train.txt", make_rows(50, seed=20))
    before = tree(data)
    cfg = CriteoConfig(raw_path=str(raw), preprocessed_dir=str(data), num_workers=1)
    for overwrite in (False, True):
        with pytest.raises(ValueError) as err:
            preprocess_criteo(cfg, overwrite=overwrite, **SMALL)
        assert str(err.value) == (
            f"output directory {str(data)!r} contains the input {str(raw)!r}; dmt-preprocess "
            "never replaces a directory that holds its input: choose another output directory"
        )
        assert tree(data) == before
    # the input in a subdirectory of a dmt output (and for transform_tsv, the vocabulary dir)
    out = preprocess_criteo(config(tmp_path, raw), **SMALL)
    (out / "extra").mkdir()
    inside = write(out / "extra" / "day.tsv", make_rows(20, seed=21))
    with pytest.raises(ValueError, match="contains the input .*day.tsv'; dmt-preprocess never"):
        transform_tsv(out, inside, out, overwrite=True, progress=False)
    with pytest.raises(ValueError, match=f"contains the input {re.escape(repr(str(out)))}"):
        transform_tsv(out, raw, out, overwrite=True, progress=False)
    assert inside.is_file() and read_manifest(out)


def test_overwrite_refuses_a_directory_that_dmt_did_not_write(tmp_path: Path) -> None:
    """Bug: ``--overwrite`` deleted any directory, and the error suggested ``--overwrite``."""
    raw = write(tmp_path / "train.txt", make_rows(50, seed=22))
    out = tmp_path / "out"
    (out / "sub").mkdir(parents=True)
    (out / "notes.txt").write_text("mine")
    (out / "sub" / "more.txt").write_text("mine too")
    for overwrite in (False, True):
        with pytest.raises(ValueError) as err:
            preprocess_criteo(config(tmp_path, raw), overwrite=overwrite, **SMALL)
        assert str(err.value) == (
            f"output directory {str(out)!r} exists and is not a dmt-preprocess output (it has "
            "no manifest.json or .dmt-criteo-preprocessed); dmt-preprocess replaces only its "
            "own outputs: choose another output directory or remove it yourself"
        )
        assert "--overwrite" not in str(err.value)
    assert tree(out) == {"notes.txt": b"mine", "sub/more.txt": b"mine too"}
    # a plain file is refused too; an empty directory is simply used
    (tmp_path / "file").write_text("x")
    cfg = CriteoConfig(raw_path=str(raw), preprocessed_dir=str(tmp_path / "file"))
    with pytest.raises(ValueError, match="'.*file' exists and is not a directory; choose another"):
        preprocess_criteo(cfg, overwrite=True, **SMALL)
    (tmp_path / "empty").mkdir()
    cfg = CriteoConfig(raw_path=str(raw), preprocessed_dir=str(tmp_path / "empty"), num_workers=1)
    assert read_manifest(preprocess_criteo(cfg, **SMALL))["splits"]["train"]["rows"] == 42


def test_overwrite_refuses_a_dmt_output_with_other_files_and_deletes_only_dmt_files(
    tmp_path: Path,
) -> None:
    raw = write(tmp_path / "train.txt", make_rows(50, seed=23))
    cfg = config(tmp_path, raw)
    out = preprocess_criteo(cfg, **SMALL)
    dmt_files = set(tree(out))
    assert ".dmt-criteo-preprocessed" in dmt_files and "vocab/cat_25_counts.npy" in dmt_files
    (out / "README.txt").write_text("my notes")
    (out / "train" / "mine.npy").write_bytes(b"x")
    cfg.frequency_threshold = 1
    with pytest.raises(ValueError) as err:
        preprocess_criteo(cfg, overwrite=True, **SMALL)
    assert str(err.value) == (
        f"output directory {str(out)!r} is a dmt-preprocess output but also holds entries "
        "dmt-preprocess did not write (README.txt, train/mine.npy); it is not replaced, so that "
        "nothing else is deleted: move them out or choose another output directory"
    )
    assert (out / "README.txt").read_text() == "my notes" and (out / "train" / "mine.npy").exists()
    (out / "README.txt").unlink()
    (out / "train" / "mine.npy").unlink()
    with pytest.raises(ValueError, match=r"was made with other settings or sources "
                       r"\(categorical.frequency_threshold: 3 there, 1 asked\); pass "
                       r"overwrite=True \(--overwrite\) to replace it"):  # fmt: skip
        preprocess_criteo(cfg, **SMALL)
    preprocess_criteo(cfg, overwrite=True, **SMALL)
    assert read_manifest(out)["settings"]["categorical"]["frequency_threshold"] == 1
    assert set(tree(out)) == dmt_files and not list(tmp_path.glob(".out.*"))


def test_overwrite_replaces_a_partial_dmt_output(tmp_path: Path) -> None:
    raw = write(tmp_path / "train.txt", make_rows(50, seed=24))
    out = preprocess_criteo(config(tmp_path, raw), **SMALL)
    (out / "manifest.json").unlink()  # the marker alone: an incomplete dmt output
    with pytest.raises(ValueError, match="exists and is an incomplete or unreadable "
                       r"dmt-preprocess output; pass overwrite=True \(--overwrite\)"):  # fmt: skip
        preprocess_criteo(config(tmp_path, raw), **SMALL)
    preprocess_criteo(config(tmp_path, raw), overwrite=True, **SMALL)
    assert read_manifest(out)["splits"]["train"]["rows"] == 42


def test_stale_partial_without_marker_is_left_alone(tmp_path: Path) -> None:
    raw = write(tmp_path / "train.txt", make_rows(50, seed=25))
    dead = 2**22 + 12345  # above Linux's default pid_max: no such process
    foreign = tmp_path / f".out.partial-{dead}"
    (foreign / "train").mkdir(parents=True)
    (foreign / "train" / "dense.npy").write_bytes(b"not dmt's")
    stale = tmp_path / f".out.partial-{dead + 1}"
    (stale / "train").mkdir(parents=True)
    (stale / ".dmt-criteo-preprocessed").write_text("{}")
    (stale / "train" / "dense.npy").write_bytes(b"dmt's")
    # this host's runs name their directories <host>-<pid>; another host's run may be alive
    # there whatever its pid here, so its directory stays
    host = socket.gethostname()
    stale_here = tmp_path / f".out.old-{host}-{dead}"
    other_host = tmp_path / f".out.partial-{host}x-{dead}"
    for d in (stale_here, other_host):
        d.mkdir()
        (d / ".dmt-criteo-preprocessed").write_text("{}")
    preprocess_criteo(config(tmp_path, raw), **SMALL)
    assert (foreign / "train" / "dense.npy").read_bytes() == b"not dmt's"
    assert not stale.exists() and not stale_here.exists()
    assert other_host.is_dir()


def test_all_rows_bad_is_an_error_not_an_empty_output(tmp_path: Path) -> None:
    """Bug: ``--skip-bad-rows`` on a CRLF file exited 0 with 0-row splits."""
    raw = tmp_path / "train.txt"
    raw.write_bytes(("\r\n".join(make_rows(40, seed=26)) + "\r\n").encode())
    with pytest.raises(ValueError) as err:
        preprocess_criteo(config(tmp_path, raw, skip_bad_rows=True), **SMALL)
    msg = str(err.value)
    assert msg.startswith(
        f"no training rows: all 34 lines read for the train split of {str(raw.resolve())!r} "
        "were malformed and dropped (34 bad rows, skip_bad_rows / --skip-bad-rows), so nothing "
        "was written; likely cause: the file has Windows (CRLF) line endings; convert it first "
        "(dos2unix, or sed -i 's/\\r$//'); first: "
        + f"{raw.resolve()}:1: C26 ends with the control character b'\\r', a Windows (CRLF) line"
    ), msg
    assert not (tmp_path / "out").exists() and not list(tmp_path.glob(".out.*"))
    other = write(tmp_path / "other.txt", ["x\ty"] * 10)
    not_criteo = r"the input is not Criteo TSV \(40 tab-separated fields per line\); first: "
    with pytest.raises(ValueError, match=r"no training rows: all 8 lines .* cause: " + not_criteo):
        preprocess_criteo(config(tmp_path, other, skip_bad_rows=True), **SMALL)
    # transform_tsv: a file without a single good row is an error too
    out = preprocess_criteo(config(tmp_path, write(tmp_path / "ok.txt", make_rows(50))), **SMALL)
    with pytest.raises(ValueError, match=r"^no rows: all 40 lines read for the test split"):
        transform_tsv(out, raw, tmp_path / "t", skip_bad_rows=True, progress=False)
    assert not (tmp_path / "t").exists()


def test_a_file_without_labels_is_named_as_such_and_nothing_is_written(tmp_path: Path) -> None:
    """Bug: Criteo's Kaggle test.txt (39 fields: no label column) given as training rows, as a
    test file mapped through the vocabularies (``data.criteo.test_path``, ``dmt-eval --data``)
    or with ``skip_bad_rows`` was refused as 'found 39 tab-separated field(s)' or 'not Criteo
    TSV', without saying that its label column is missing."""
    rows = make_rows(60, seed=31)
    raw = write(tmp_path / "test.txt", ["\t".join(r.split("\t")[1:]) for r in rows])
    labelled = preprocess_criteo(
        config(tmp_path / "labelled", write(tmp_path / "train.txt", rows)), **SMALL
    )
    before = sorted(tmp_path.rglob("*"))
    missing = (
        f"{raw.resolve()}:1: found 39 tab-separated field(s); the label column is missing, as in "
        "Criteo's Kaggle test.txt, whose labels Criteo never published (dmt trains and scores "
        "labelled rows only); expected 40 tab-separated fields"
    )
    with pytest.raises(CriteoFormatError, match=re.escape(missing)):
        preprocess_criteo(config(tmp_path, raw), **SMALL)
    with pytest.raises(CriteoFormatError, match=re.escape(missing)):
        transform_tsv(labelled, raw, progress=False)
    cause = (
        "likely cause: the rows have no label column, like Criteo's Kaggle test.txt (Criteo "
        "never published its labels): train and score on labelled rows, e.g. train.txt's; "
        f"first: {missing}"
    )
    with pytest.raises(ValueError, match=r"^no training rows: all 51 lines .*" + re.escape(cause)):
        preprocess_criteo(config(tmp_path, raw, skip_bad_rows=True), **SMALL)
    with pytest.raises(ValueError, match=r"^no rows: all 60 lines .*" + re.escape(cause)):
        transform_tsv(labelled, raw, skip_bad_rows=True, progress=False)
    assert sorted(tmp_path.rglob("*")) == before  # nothing written, not even in part


@pytest.mark.parametrize("mode", ["w:gz", "w"])
def test_a_tar_archive_is_named_as_such(tmp_path: Path, mode: str) -> None:
    """Bug: Criteo's Kaggle download as it comes, a tar archive of readme.txt, test.txt and
    train.txt, was refused as "label contains the control character b'\\x00'" (its header)."""
    members = tmp_path / "members"
    members.mkdir()
    write(members / "readme.txt", ["made-up rows"])
    write(members / "train.txt", make_rows(50, seed=32))
    archive = tmp_path / ("dac.tar.gz" if mode == "w:gz" else "dac.tar")
    with tarfile.open(archive, mode) as tar:
        for name in ("readme.txt", "train.txt"):
            tar.add(members / name, arcname=name)
    with pytest.raises(CriteoFormatError) as err:
        preprocess_criteo(config(tmp_path, archive), **SMALL)
    assert str(err.value) == (
        f"{archive.resolve()}:1: a tar archive's header: the file is a tar archive, like "
        "Criteo's Kaggle download (which holds train.txt, test.txt and readme.txt), not one TSV "
        "file; extract train.txt first (tar -xf <archive> train.txt) and give that file"
    )
    assert not (tmp_path / "out").exists() and not list(tmp_path.glob(".out.*"))


def test_damaged_output_is_not_up_to_date(tmp_path: Path) -> None:
    """Bug: a truncated ``train/sparse.npy`` in a complete output was reported up to date."""
    raw = write(tmp_path / "train.txt", make_rows(50, seed=27))
    cfg = config(tmp_path, raw)
    out = preprocess_criteo(cfg, **SMALL)
    good = tree(out)
    sparse = out / "train" / "sparse.npy"
    size = sparse.stat().st_size
    with open(sparse, "r+b") as f:
        f.truncate(size - 100)
    damage = f"{sparse} is {size - 100:,d} bytes; its int32 (42, 26) needs {size:,d} bytes"
    with pytest.raises(ValueError) as err:
        preprocess_criteo(cfg, **SMALL)
    assert str(err.value) == (
        f"output directory {str(out)!r} is damaged: {damage}; pass overwrite=True (--overwrite) "
        "to rebuild it"
    )
    assert output_damage(out) == damage
    with pytest.raises(ValueError, match=re.escape(f"{sparse} is {size - 100:,d} bytes")):
        open_array(sparse)  # readers name the file too
    preprocess_criteo(cfg, overwrite=True, **SMALL)
    assert tree(out) == good
    (out / "vocab" / "cat_3.npy").unlink()
    assert output_damage(out) == f"{out / 'vocab' / 'cat_3.npy'} is missing"
    preprocess_criteo(cfg, rebuild_damaged=True, **SMALL)  # what training's auto-preprocess does
    assert tree(out) == good
    # a truncated manifest is named (reproduced bug: a bare JSONDecodeError in --vocab-from and
    # in training's data.criteo.auto_preprocess=false)
    manifest = out / "manifest.json"
    manifest.write_bytes(manifest.read_bytes()[:200])
    with pytest.raises(ValueError) as err:
        read_manifest(out)
    assert str(err.value).startswith(f"{manifest} is not a complete manifest (")
    assert str(err.value).endswith(
        "): the directory is damaged; rebuild it with dmt-preprocess --overwrite"
    )
    assert output_damage(out) == str(err.value)
    with pytest.raises(ValueError, match=re.escape(f"{manifest} is not a complete manifest")):
        transform_tsv(out, raw, progress=False, num_workers=1)


def test_the_data_configs_preprocess_commands_make_what_they_ask() -> None:
    """Reproduced bug: ``conf/data/criteo_kaggle.yaml`` said to preprocess with
    ``dmt-preprocess /path/to/train.txt data_cache/criteo_kaggle``, whose default split (0.85 /
    0.075 / 0.075) is not the config's (0.857 / 0.0715 / 0.0715): ``dmt-train data=criteo_kaggle``
    then refused the directory as made with other settings. The ``dmt-preprocess`` command in a
    data config's comments must write the directory that config reads, with its settings."""
    from dmt.data.preprocess_cli import build_parser, config_of

    fields = ("split_fractions", "train_days", "eval_day", "val_day", "val_split")
    fields += ("categorical_mode", "frequency_threshold", "missing_id", "hash_sizes")
    checked = []
    conf = Path(__file__).resolve().parents[2] / "dmt" / "conf" / "data"
    for path in sorted(conf.glob("*.yaml")):
        commands = re.findall(r"^#.*?dmt-preprocess (.+)$", path.read_text(), re.MULTILINE)
        for command in commands:
            args = build_parser().parse_args(command.split())
            asked = typed_config(f"data={path.stem}").data.criteo
            written = config_of(args)
            assert args.output == asked.preprocessed_dir, path.name
            for name in fields:
                assert getattr(written, name) == getattr(asked, name), (path.name, name)
            checked.append(path.stem)
    assert {"criteo_kaggle", "criteo_1tb", "criteo_1tb_forward"} <= set(checked)
