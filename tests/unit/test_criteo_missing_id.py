"""``data.criteo.missing_id``: empty categorical fields apart from rare and unseen values, on rows
made up here (never Criteo rows)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from dmt.config import DataConfig
from dmt.data.criteo_dataset import build_criteo
from dmt.data.criteo_preprocess import (
    output_damage,
    preprocess_criteo,
    read_manifest,
    transform_tsv,
)
from tests.unit.test_criteo_preprocess import (
    SMALL,
    config,
    load_split,
    make_rows,
    ref_parse,
    ref_vocab,
    write,
)

INTS = ["1"] * 13


def row(value: str) -> str:
    """A line whose 26 categorical fields all hold ``value`` ("" = empty)."""
    return "\t".join(["0", *INTS, *([value] * 26)])


# train: "a" 3 times (kept at threshold 2), "b" once (rare), 2 empty; val and test: "a", "c"
# (never seen in train), an empty field
TRAIN = [row("a"), row("b"), row(""), row("a"), row(""), row("a")]
VAL = [row("c"), row(""), row("a")]
TEST = [row("a"), row("c"), row("")]
FRACTIONS = [6 / 12, 3 / 12, 3 / 12]


def _preprocess(tmp_path: Path, missing_id: str) -> Path:
    raw = write(tmp_path / "train.txt", TRAIN + VAL + TEST)
    cfg = config(
        tmp_path, raw, split_fractions=FRACTIONS, frequency_threshold=2, missing_id=missing_id
    )
    return preprocess_criteo(cfg, **SMALL)


@pytest.mark.parametrize(
    ("missing_id", "a", "rare", "empty", "rows"),
    [("distinct", 2, 0, 1, 3), ("shared", 1, 0, 0, 2)],
)
def test_empty_fields_get_their_own_id(tmp_path, missing_id, a, rare, empty, rows):
    """distinct: empty -> 1, rare ("b") and unseen ("c") -> 0, kept ("a") -> 2; shared: the
    empty fields join the rare and unseen ones in id 0."""
    out = _preprocess(tmp_path, missing_id)
    expected = {
        "train": [a, rare, empty, a, empty, a],
        "val": [rare, empty, a],  # "c" is unseen: the rare bucket
        "test": [a, rare, empty],
    }
    for split, ids in expected.items():
        sparse = load_split(out, split)[1]
        np.testing.assert_array_equal(sparse, np.repeat(np.array(ids)[:, None], 26, axis=1))
    m = read_manifest(out)
    assert m["cardinalities"] == [rows] * 26  # distinct: one row more
    # the vocabulary and its training counts: "a" alone, 3 times
    np.testing.assert_array_equal(np.load(out / "vocab" / "cat_0.npy"), [0xA])
    np.testing.assert_array_equal(np.load(out / "vocab" / "cat_0_counts.npy"), [3])
    counts = np.bincount(load_split(out, "train")[1][:, 0], minlength=rows)
    assert counts.tolist() == ([1, 2, 3] if missing_id == "distinct" else [3, 3])
    if missing_id == "distinct":
        assert m["settings"]["categorical"]["missing_id"] == "distinct"
        assert m["categorical"]["id_1"] == "empty fields"
        assert "empty" not in m["categorical"]["id_0"]
    else:  # recorded only when distinct: directories made before the setting stay valid
        assert "missing_id" not in m["settings"]["categorical"]


def test_distinct_ids_match_a_reference_over_many_rows(tmp_path):
    """Rows of every kind across many parse blocks, and a raw file mapped through the
    training vocabularies (dmt-eval's path)."""
    rows = make_rows(200, seed=3)
    raw = write(tmp_path / "train.txt", rows)
    out = preprocess_criteo(config(tmp_path, raw, missing_id="distinct"), **SMALL)
    vocab = ref_vocab(rows[:170], 3)

    def expected(lines: list[str]) -> list[list[int]]:
        return [
            [1 if v is None else vocab[f].get(v, -1) + 1 for f, v in enumerate(ref_parse(r)[2])]
            for r in lines
        ]

    got = np.concatenate([load_split(out, s)[1] for s in ("train", "val", "test")])
    np.testing.assert_array_equal(got, expected(rows))
    assert read_manifest(out)["cardinalities"] == [len(v) + 2 for v in vocab]
    extra_rows = make_rows(40, seed=8, pool=30)  # partly unseen values
    t = transform_tsv(out, write(tmp_path / "extra.tsv", extra_rows), progress=False)
    np.testing.assert_array_equal(load_split(t, "test")[1], expected(extra_rows))
    assert (load_split(t, "test")[1] == 0).any() and (load_split(t, "test")[1] == 1).any()


def test_a_directory_made_with_the_other_setting_is_refused(tmp_path):
    out = _preprocess(tmp_path, "shared")
    with pytest.raises(
        ValueError,
        match=r"was made with other settings or sources \(categorical.missing_id: 'shared' "
        r"there, 'distinct' asked[;)]",
    ):
        _preprocess(tmp_path, "distinct")
    # used as it is (no raw_path): the loader refuses it too
    criteo = config(tmp_path, tmp_path / "train.txt", missing_id="distinct")
    criteo.raw_path, criteo.auto_preprocess = None, False
    with pytest.raises(
        ValueError,
        match=r"data.criteo.missing_id='distinct', but data.criteo.preprocessed_dir=.* was "
        r"preprocessed with missing_id='shared' \(its manifest.json\): set "
        r"data.criteo.missing_id=shared",
    ):
        build_criteo(DataConfig(kind="criteo", batch_size=2, criteo=criteo))
    assert read_manifest(out)["cardinalities"] == [2] * 26


def test_hash_mode_keeps_empty_fields_apart_either_way(tmp_path):
    """Hash mode gives empty fields id 0 and hashes values to 1..size-1 with either setting:
    the output (and its settings) are the same, so the second run is a no-op."""
    raw = write(tmp_path / "train.txt", TRAIN + VAL + TEST)
    kw = {"categorical_mode": "hash", "hash_sizes": [5], "split_fractions": FRACTIONS}
    out = preprocess_criteo(config(tmp_path, raw, missing_id="shared", **kw), **SMALL)
    stamp = (out / "manifest.json").stat().st_mtime_ns
    preprocess_criteo(config(tmp_path, raw, missing_id="distinct", **kw), **SMALL)
    assert (out / "manifest.json").stat().st_mtime_ns == stamp
    train = load_split(out, "train")[1]
    assert (train[[2, 4]] == 0).all() and (train[[0, 1, 3, 5]] > 0).all()


def test_missing_id_must_be_known(tmp_path):
    with pytest.raises(ValueError, match=r"missing_id must be one of \('shared', 'distinct'\)"):
        config(tmp_path, tmp_path / "x.txt", missing_id="own").validate()


@pytest.mark.parametrize("missing_id", ["distinct", "shared"])
def test_a_directory_made_with_either_setting_loads(tmp_path, missing_id):
    # regression: the integrity check expected cardinality - 1 vocabulary entries, so a
    # distinct-missing directory (cardinality = vocabulary + 2) read as damaged
    out = _preprocess(tmp_path, missing_id)
    assert output_damage(out) is None
    criteo = config(tmp_path, tmp_path / "train.txt", missing_id=missing_id)
    criteo.raw_path, criteo.auto_preprocess = None, False
    bundle = build_criteo(DataConfig(kind="criteo", batch_size=2, criteo=criteo))
    assert bundle.cardinalities == [3 if missing_id == "distinct" else 2] * 26
