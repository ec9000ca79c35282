"""CriteoSource: per-rank slicing, determinism, KJT layout, memory-mapped vs in-memory."""

from __future__ import annotations

import json
import logging
import random
import re
import threading
from pathlib import Path

import numpy as np
import pytest
import torch

from dmt.config import DataConfig
from dmt.data import build_data
from dmt.data.criteo_config import CriteoConfig
from dmt.data.criteo_dataset import (
    CriteoSource,
    as_criteo_config,
    build_criteo,
    criteo_schema,
    tsv_source,
)
from dmt.data.criteo_preprocess import preprocess_criteo, read_manifest

NUM_ROWS = 1003  # not a multiple of any batch size used below


@pytest.fixture(scope="module")
def split(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("split")
    rng = np.random.default_rng(0)
    np.save(d / "dense.npy", rng.random((NUM_ROWS, 13), dtype=np.float32))
    # row i, feature f -> 100 * i + f: every id says where it came from
    np.save(d / "sparse.npy", (100 * np.arange(NUM_ROWS)[:, None] + np.arange(26)).astype(np.int32))
    np.save(d / "labels.npy", (rng.random(NUM_ROWS) < 0.3).astype(np.int8))
    return d


def arrays(split: Path) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    return tuple(np.load(split / f"{n}.npy") for n in ("dense", "sparse", "labels"))  # type: ignore[return-value]


def rows_of(batch: object) -> np.ndarray:
    """Row indices encoded in a batch's ids (see the fixture)."""
    kjt = batch.sparse_features  # type: ignore[attr-defined]
    return kjt["cat_0"].values().numpy() // 100


@pytest.mark.parametrize("in_memory", [False, True])
@pytest.mark.parametrize("shuffle,window", [(False, None), (True, None), (True, 64), (True, 1000)])
def test_batches_hold_the_rows_they_claim(
    split: Path, in_memory: bool, shuffle: bool, window: int | None
) -> None:
    dense, sparse, labels = arrays(split)
    src = CriteoSource(
        split,
        batch_size=96,
        shuffle=shuffle,
        seed=3,
        shuffle_window_rows=window,
        in_memory=in_memory,
    )
    assert src.num_batches() == -(-NUM_ROWS // 96)
    seen = []
    for b, batch in enumerate(src.batches(epoch=2)):
        rows = src.rows(2, b)
        kjt = batch.sparse_features
        assert kjt.keys() == [f"cat_{f}" for f in range(26)]
        assert (kjt.lengths() == 1).all() and kjt.stride() == len(rows)
        # values are grouped by key, then by sample
        np.testing.assert_array_equal(kjt.values().numpy(), sparse[rows].T.reshape(-1))
        for f in (0, 7, 25):
            np.testing.assert_array_equal(kjt[f"cat_{f}"].values().numpy(), sparse[rows, f])
        torch.testing.assert_close(batch.dense_features, torch.from_numpy(dense[rows]))
        torch.testing.assert_close(batch.labels, torch.from_numpy(labels[rows].astype(np.float32)))
        seen.append(rows)
    seen_all = np.concatenate(seen)
    np.testing.assert_array_equal(np.sort(seen_all), np.arange(NUM_ROWS))  # a permutation
    assert (seen_all == np.arange(NUM_ROWS)).all() != shuffle


@pytest.mark.parametrize("world_size", [2, 3, 4])
@pytest.mark.parametrize("drop_last", [False, True])
def test_rank_shares_concatenate_to_the_global_batch(
    split: Path, world_size: int, drop_last: bool
) -> None:
    kw = dict(batch_size=96, shuffle=True, seed=7, drop_last=drop_last, shuffle_window_rows=200)
    single = [rows_of(b) for b in CriteoSource(split, **kw).batches(1)]
    per_rank = [
        [rows_of(b) for b in CriteoSource(split, rank=r, world_size=world_size, **kw).batches(1)]
        for r in range(world_size)
    ]
    assert all(len(p) == len(single) for p in per_rank)
    assert len(single) == (NUM_ROWS // 96 if drop_last else -(-NUM_ROWS // 96))
    for b, whole in enumerate(single):
        np.testing.assert_array_equal(np.concatenate([p[b] for p in per_rank]), whole)
        if len(whole) == 96:
            assert {len(p[b]) for p in per_rank} == {96 // world_size}


def test_deterministic_by_seed_and_epoch_and_resumable(split: Path) -> None:
    def order(seed: int, epoch: int, start: int = 0) -> list[np.ndarray]:
        src = CriteoSource(split, batch_size=50, shuffle=True, seed=seed, drop_last=True)
        return [rows_of(b) for b in src.batches(epoch, start)]

    a = order(1, 0)
    assert all((x == y).all() for x, y in zip(a, order(1, 0)))
    assert not all((x == y).all() for x, y in zip(a, order(1, 1)))
    assert not all((x == y).all() for x, y in zip(a, order(2, 0)))
    tail = order(1, 0, start=7)
    assert len(tail) == len(a) - 7 and all((x == y).all() for x, y in zip(a[7:], tail))


def test_shuffle_windows_stay_local(split: Path) -> None:
    src = CriteoSource(split, batch_size=25, shuffle=True, seed=0, shuffle_window_rows=100)
    for b in range(src.num_batches()):
        windows = set(src.global_rows(0, b) // 100)
        assert len(windows) <= 2  # a batch reads from at most two windows of the file


def test_windows_and_their_rows_are_reshuffled_every_epoch(split: Path) -> None:
    """Each epoch visits every window once, whole, in an order of its own (by seed and epoch),
    and each window's rows in a permutation of their own."""
    size = 100

    def order(seed: int, epoch: int) -> np.ndarray:
        src = CriteoSource(split, batch_size=25, shuffle=True, seed=seed, shuffle_window_rows=size)
        return np.concatenate([src.global_rows(epoch, b) for b in range(src.num_batches())])

    def visits(rows: np.ndarray) -> list[int]:
        windows = rows // size
        return windows[np.r_[True, windows[1:] != windows[:-1]]].tolist()

    a = order(0, 0)
    assert sorted(visits(a)) == list(range(-(-NUM_ROWS // size)))  # each window once, whole
    assert visits(a) != visits(order(0, 1)) and visits(a) != visits(order(1, 0))
    full = [a[a // size == w] - w * size for w in range(NUM_ROWS // size)]
    assert len({tuple(p) for p in full}) == len(full)


def test_mmap_and_in_memory_agree(split: Path) -> None:
    kw = dict(batch_size=64, shuffle=True, seed=5, shuffle_window_rows=300)
    mapped = list(CriteoSource(split, **kw).batches(0))
    loaded = list(CriteoSource(split, in_memory=True, **kw).batches(0))
    assert len(mapped) == len(loaded) > 1
    for x, y in zip(mapped, loaded, strict=True):
        torch.testing.assert_close(x.dense_features, y.dense_features)
        torch.testing.assert_close(x.sparse_features.values(), y.sparse_features.values())
        torch.testing.assert_close(x.sparse_features.lengths(), y.sparse_features.lengths())
        torch.testing.assert_close(x.labels, y.labels)


def test_prefetch_stops_early_and_reraises(split: Path) -> None:
    before = threading.active_count()
    it = CriteoSource(split, batch_size=10, prefetch_batches=2).batches(0)
    next(it)
    it.close()  # type: ignore[attr-defined]
    assert threading.active_count() == before
    src = CriteoSource(split, batch_size=10, prefetch_batches=2)
    src.make_batch = lambda *a: (_ for _ in ()).throw(RuntimeError("boom"))  # type: ignore[method-assign]
    with pytest.raises(RuntimeError, match="boom"):
        list(src.batches(0))


def test_bad_arguments(split: Path) -> None:
    with pytest.raises(ValueError, match="divisible"):
        CriteoSource(split, batch_size=10, world_size=3, drop_last=True)
    with pytest.raises(ValueError, match="rank 2"):
        CriteoSource(split, batch_size=10, rank=2, world_size=2)


def _raw_rows(n: int, seed: int) -> str:
    rng = random.Random(seed)
    lines = []
    for _ in range(n):
        ints = [str(rng.randrange(-1, 50)) for _ in range(13)]
        cats = [f"{rng.randrange(6):08x}" for _ in range(26)]
        lines.append("\t".join([str(rng.randrange(2)), *ints, *cats]))
    return "\n".join(lines) + "\n"


def test_build_criteo_bundle_and_test_path(tmp_path: Path) -> None:
    raw = tmp_path / "train.txt"
    raw.write_text(_raw_rows(400, seed=1))
    extra = tmp_path / "extra.tsv"
    extra.write_text(_raw_rows(37, seed=2))
    crit = CriteoConfig(raw_path=str(raw), preprocessed_dir=str(tmp_path / "prep"), num_workers=1)
    preprocess_criteo(crit, progress=False)
    cfg = DataConfig(kind="criteo", batch_size=64, eval_batch_size=100, criteo=crit)
    bundle = build_criteo(cfg, rank=1, world_size=2, seed=0)
    m = read_manifest(tmp_path / "prep")
    assert bundle.cardinalities == m["cardinalities"] and bundle.num_dense == 13
    assert bundle.feature_names == [f"cat_{i}" for i in range(26)]
    assert criteo_schema(cfg) == (bundle.feature_names, bundle.cardinalities, 13)
    assert bundle.train.num_batches() == 340 // 64 and bundle.val.num_batches() == 1
    batch = next(iter(bundle.train.batches(0)))
    assert batch.dense_features.shape == (32, 13)

    cfg.criteo = CriteoConfig(**{**crit.__dict__, "test_path": str(extra)})  # type: ignore[arg-type]
    bundle = build_criteo(cfg, rank=0, world_size=1)
    labels = torch.cat([b.labels for b in bundle.test.batches(0)])
    want = [float(line.split("\t")[0]) for line in extra.read_text().splitlines()]
    assert labels.tolist() == want
    direct = tsv_source(tmp_path / "prep", extra, batch_size=100, progress=False)
    assert direct.directory == Path(bundle.info["test_dir"])


def _with_test_path(tmp_path: Path, prep: Path) -> tuple[DataConfig, CriteoConfig, Path]:
    """Criteo data from a raw file of 200 rows preprocessed into ``prep``, with a test file of
    37 rows (``data.criteo.test_path``, returned last)."""
    raw = tmp_path / "train.txt"
    raw.write_text(_raw_rows(200, seed=1))
    extra = tmp_path / "extra.tsv"
    extra.write_text(_raw_rows(37, seed=2))
    crit = CriteoConfig(
        raw_path=str(raw), preprocessed_dir=str(prep), test_path=str(extra), num_workers=1
    )
    cfg = DataConfig(kind="criteo", batch_size=32, eval_batch_size=100, criteo=crit)
    return cfg, crit, extra


def test_a_moved_test_path_is_not_transformed_again(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A reproduced bug: data.criteo.test_path moved (or copied, touched) was transformed again
    into a new directory beside data.criteo.preprocessed_dir, where a moved raw_path is used as it
    is. The same rows are read from the first transform, with the warning naming the file; other
    rows are transformed again."""
    cfg, crit, extra = _with_test_path(tmp_path, tmp_path / "prep")
    first = build_criteo(cfg).info["test_dir"]
    moved = tmp_path / "moved.tsv"
    extra.rename(moved)
    cfg.criteo = CriteoConfig(**{**crit.__dict__, "test_path": str(moved)})  # type: ignore[arg-type]
    with caplog.at_level(logging.WARNING, logger="dmt.data.criteo_preprocess"):
        bundle = build_criteo(cfg)
    assert bundle.info["test_dir"] == first
    assert f"input file 0 {str(moved)!r}: path {str(extra)!r} there, {str(moved)!r} now" in (
        caplog.text
    )
    assert len(list(tmp_path.glob("prep.*"))) == 1
    labels = torch.cat([b.labels for b in bundle.test.batches(0)])
    assert labels.tolist() == [float(line[0]) for line in moved.read_text().splitlines()]

    text = moved.read_text()  # one label flipped: other rows of the same size
    moved.write_text(("1" if text[0] == "0" else "0") + text[1:])
    bundle = build_criteo(cfg)
    assert bundle.info["test_dir"] != first
    labels = torch.cat([b.labels for b in bundle.test.batches(0)])
    assert labels.tolist() == [float(line[0]) for line in moved.read_text().splitlines()]


def test_a_moved_preprocessed_directory_keeps_its_transformed_test_path(tmp_path: Path) -> None:
    """A reproduced bug: data.criteo.preprocessed_dir moved (with what dmt caches beside it) and
    data.criteo.preprocessed_dir set to its new place reused the training data but transformed
    data.criteo.test_path again (the vocabularies' path is in the transform's settings hash)."""
    cfg, crit, extra = _with_test_path(tmp_path, tmp_path / "data" / "prep")
    first = Path(build_criteo(cfg).info["test_dir"])
    (tmp_path / "scratch").mkdir()
    data = (tmp_path / "data").rename(tmp_path / "scratch" / "data")
    stamps = {p: p.stat().st_mtime_ns for p in data.rglob("*")}
    moved = {**crit.__dict__, "preprocessed_dir": str(data / "prep")}
    cfg.criteo = CriteoConfig(**moved)  # type: ignore[arg-type]
    bundle = build_criteo(cfg)
    assert bundle.info["test_dir"] == str(data / first.parent.name / "test")
    assert {p: p.stat().st_mtime_ns for p in data.rglob("*")} == stamps  # nothing written
    labels = torch.cat([b.labels for b in bundle.test.batches(0)])
    assert labels.tolist() == [float(line[0]) for line in extra.read_text().splitlines()]


def test_build_criteo_preprocesses_from_raw_path_once(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    raw = tmp_path / "train.txt"
    raw.write_text(_raw_rows(200, seed=3))
    out = tmp_path / "prep"
    crit = CriteoConfig(raw_path=str(raw), preprocessed_dir=str(out), num_workers=1)
    cfg = DataConfig(kind="criteo", batch_size=32, eval_batch_size=50, criteo=crit)
    bundle = build_criteo(cfg)  # no dmt-preprocess run before: the trainer's first call makes it
    manifest = read_manifest(out)
    assert manifest["splits"]["train"]["rows"] == 170 and bundle.train.num_batches() == 170 // 32
    stamp = (out / "manifest.json").stat().st_mtime_ns
    build_criteo(cfg)  # up to date: untouched
    assert (out / "manifest.json").stat().st_mtime_ns == stamp

    # the same directory with other settings: an error that says how to proceed, data untouched
    cfg.criteo = CriteoConfig(**{**crit.__dict__, "frequency_threshold": 5})  # type: ignore[arg-type]
    with pytest.raises(
        ValueError,
        match=r"preprocessing data\.criteo\.raw_path=.* into "
        r"data\.criteo\.preprocessed_dir=.* failed: output directory .* exists and "
        r"was made with other settings or sources.*auto_preprocess=false",
    ):
        build_criteo(cfg)
    assert (out / "manifest.json").stat().st_mtime_ns == stamp
    cfg.criteo.auto_preprocess = False  # use the directory as it is
    with caplog.at_level(logging.WARNING, logger="dmt.data.criteo_dataset"):
        assert build_criteo(cfg).cardinalities == manifest["cardinalities"]
    # saying so, and where (a reproduced bug: silently, while the run recorded threshold 5)
    assert (
        f"data.criteo.preprocessed_dir={str(out)!r} was made with other settings than "
        "data.criteo asks (categorical.frequency_threshold: "
    ) in caplog.text
    assert " there, 5 asked); it is used as it is, with its own settings" in caplog.text
    caplog.clear()
    cfg.criteo = CriteoConfig(**{**crit.__dict__, "auto_preprocess": False})  # type: ignore[arg-type]
    with caplog.at_level(logging.WARNING, logger="dmt.data.criteo_dataset"):
        build_criteo(cfg)  # its own settings: nothing to say
    assert "other settings" not in caplog.text

    cfg.criteo = CriteoConfig(
        raw_path=str(tmp_path / "missing.txt"), preprocessed_dir=str(tmp_path / "p2"), num_workers=1
    )
    with pytest.raises(ValueError, match=r"missing\.txt' is neither a file nor a directory"):
        build_criteo(cfg)
    assert not (tmp_path / "p2").exists()


def test_build_criteo_keeps_the_directory_of_a_raw_file_moved_since(tmp_path: Path) -> None:
    """A reproduced bug: a raw file moved (or copied to a scratch disk, or touched) since its
    data.criteo.preprocessed_dir was made stopped training there with auto_preprocess=true (a
    resume too, though a resume may move data.criteo.raw_path), as if made from other rows. The
    directory is used as it is; a raw file whose rows changed is still refused."""
    text = _raw_rows(200, seed=7)
    raw = tmp_path / "train.txt"
    raw.write_text(text)
    out = tmp_path / "prep"
    crit = CriteoConfig(raw_path=str(raw), preprocessed_dir=str(out), num_workers=1)
    cfg = DataConfig(kind="criteo", batch_size=32, eval_batch_size=50, criteo=crit)
    first = build_criteo(cfg)
    stamp = (out / "manifest.json").stat().st_mtime_ns
    (tmp_path / "scratch").mkdir()
    moved = tmp_path / "scratch" / "copy.txt"
    moved.write_text(text)  # another path, another modification time
    cfg.criteo = CriteoConfig(**{**crit.__dict__, "raw_path": str(moved)})  # type: ignore[arg-type]
    bundle = build_criteo(cfg)
    assert bundle.train_fingerprint == first.train_fingerprint
    assert bundle.info == first.info
    assert (out / "manifest.json").stat().st_mtime_ns == stamp

    moved.write_text(("1" if text[0] == "0" else "0") + text[1:])  # other rows, the same size
    with pytest.raises(ValueError) as err:
        build_criteo(cfg)
    assert str(err.value).startswith(
        f"preprocessing data.criteo.raw_path={str(moved)!r} into data.criteo.preprocessed_dir="
        f"{str(out)!r} failed: output directory {str(out)!r} exists and was made with other "
        f"settings or sources (input file 0 {str(moved)!r}: path {str(raw)!r} there, "
        f"{str(moved)!r} now, modified "
    )
    assert str(err.value).endswith(
        " now, sampled fingerprint differs); pass overwrite=True "
        "(--overwrite) to replace it or choose another directory (dmt-train never replaces a "
        "preprocessed directory: set data.criteo.preprocessed_dir to another one, rebuild this one "
        "with dmt-preprocess --overwrite, or set data.criteo.auto_preprocess=false to use an "
        "existing directory as is)"
    )
    assert (out / "manifest.json").stat().st_mtime_ns == stamp


def test_build_criteo_reports_a_bad_raw_row_without_advice_on_the_directory(
    tmp_path: Path,
) -> None:
    """Reproduced: a malformed row (or a missing input) in data.criteo.raw_path came with the
    advice for an existing directory of other settings (another preprocessed_dir, dmt-preprocess
    --overwrite, auto_preprocess=false), none of which helps: the row is what needs fixing."""
    lines = _raw_rows(200, seed=6).splitlines()
    fields = lines[41].split("\t")
    fields[1] = "1.5"
    lines[41] = "\t".join(fields)
    raw = tmp_path / "train.txt"
    raw.write_text("\n".join(lines) + "\n")
    out = tmp_path / "prep"
    crit = CriteoConfig(raw_path=str(raw), preprocessed_dir=str(out), num_workers=1)
    with pytest.raises(ValueError) as err:
        build_criteo(DataConfig(kind="criteo", batch_size=32, criteo=crit))
    assert str(err.value) == (
        f"preprocessing data.criteo.raw_path={str(raw)!r} into data.criteo.preprocessed_dir="
        f"{str(out)!r} failed: {raw.resolve()}:42: I1 is '1.5'; expected a decimal integer or an "
        "empty field"
    )
    assert not out.exists()


# -- training data that cannot train, damaged directories ---------------------------------------


def _empty_train_split(root: Path) -> None:
    """Make ``root``'s training split 0 rows, as dmt-preprocess wrote it before it refused that."""
    for name, tail, dtype in (("dense", (13,), np.float32), ("sparse", (26,), np.int32),
                              ("labels", (), np.int8)):  # fmt: skip
        np.save(root / "train" / f"{name}.npy", np.empty((0, *tail), dtype))
    manifest = json.loads((root / "manifest.json").read_text())
    manifest["splits"]["train"].update(rows=0, clicks=0, click_rate=None)
    (root / "manifest.json").write_text(json.dumps(manifest))


def _raw_200(tmp_path: Path, *, seed: int, batch_size: int) -> tuple[Path, DataConfig]:
    """A 200-line raw file (170 training rows) and a data config that preprocesses it."""
    raw = tmp_path / "train.txt"
    raw.write_text(_raw_rows(200, seed=seed))
    out = tmp_path / "prep"
    crit = CriteoConfig(raw_path=str(raw), preprocessed_dir=str(out), num_workers=1)
    return out, DataConfig(kind="criteo", batch_size=batch_size, criteo=crit)


def test_build_criteo_refuses_fewer_training_rows_than_one_batch(tmp_path: Path) -> None:
    out, cfg = _raw_200(tmp_path, seed=4, batch_size=256)
    crit = as_criteo_config(cfg.criteo)
    preprocess_criteo(crit, progress=False)
    with pytest.raises(ValueError) as err:
        build_data(cfg, rank=1, world_size=2)
    assert str(err.value) == (
        f"the training split of data.criteo.preprocessed_dir={str(out)!r} (170 rows) is smaller "
        "than one batch (data.batch_size=256, the global batch over 2 ranks): training drops the "
        "last partial batch, so it would run no step; provide at least data.batch_size training "
        "rows or lower data.batch_size"
    )
    cfg.batch_size = 170  # exactly one global batch: 85 rows on each of 2 ranks
    assert build_data(cfg, rank=1, world_size=2).train.num_batches() == 1
    _empty_train_split(out)
    with pytest.raises(ValueError, match=r"\(0 rows\) holds no training rows \(data.batch_size="):
        build_data(cfg)


def test_build_criteo_never_uses_a_damaged_directory(tmp_path: Path) -> None:
    out, cfg = _raw_200(tmp_path, seed=5, batch_size=32)
    crit = as_criteo_config(cfg.criteo)
    build_criteo(cfg)
    sparse = out / "train" / "sparse.npy"
    good = sparse.read_bytes()
    with open(sparse, "r+b") as f:
        f.truncate(len(good) - 104)
    crit.auto_preprocess = False  # used as is: an error naming the file
    with pytest.raises(ValueError, match=re.escape(
        f"data.criteo.preprocessed_dir={str(out)!r} is damaged: {sparse} is "
        f"{len(good) - 104:,d} bytes; its int32 (170, 26) needs {len(good):,d} bytes; rebuild it"
    )):  # fmt: skip
        build_criteo(cfg)
    crit.auto_preprocess = True  # dmt's own output with the same settings: rebuilt
    assert build_criteo(cfg).train.num_batches() == 170 // 32
    assert sparse.read_bytes() == good


def test_build_criteo_refuses_validation_rows_under_val_split_false(tmp_path: Path) -> None:
    """data.criteo.val_split=false with a directory that has validation rows (used as it is):
    an error naming both, not a run that silently reports on rows it was told are not there."""
    out, cfg = _raw_200(tmp_path, seed=5, batch_size=32)
    build_criteo(cfg)  # 85% / 7.5% / 7.5%: 15 validation rows
    crit = as_criteo_config(cfg.criteo)
    crit.val_split, crit.auto_preprocess = False, False
    message = (
        f"data.criteo.val_split=false, but data.criteo.preprocessed_dir={str(out)!r} holds 15 "
        "validation rows (its manifest.json): preprocess into another directory without them "
        "(dmt-preprocess --no-val, or --split-fractions TRAIN 0 TEST for one file), or set "
        "data.criteo.val_split=true"
    )
    with pytest.raises(ValueError, match=f"^{re.escape(message)}$"):
        build_criteo(cfg)
    crit.split_fractions, crit.auto_preprocess = [0.85, 0.0, 0.15], True
    crit.preprocessed_dir = str(tmp_path / "no_val")
    assert build_criteo(cfg).val.num_batches() == 0
