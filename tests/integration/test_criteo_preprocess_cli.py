"""``dmt-preprocess`` end to end: CLI, interrupted runs, and the shared Criteo samples."""

from __future__ import annotations

import dataclasses
import math
import os
import random
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from dmt.data.criteo_config import CriteoConfig
from dmt.data.criteo_dataset import CriteoSource
from dmt.data.criteo_preprocess import PAUSE_ENV, preprocess_criteo, read_manifest
from dmt.data.preprocess_cli import main
from tests.conftest import typed_config

REPO = Path(__file__).parents[2]
SHARED = REPO / ".." / "shared" / "data"
KAGGLE = SHARED / "criteo-kaggle-sample" / "train.tsv"
TB_HEAD = SHARED / "criteo-1tb-day0-head" / "day_0.tsv"


def raw_rows(n: int, seed: int) -> str:
    rng = random.Random(seed)
    lines = []
    for _ in range(n):
        ints = [rng.choice(["", "-1", str(rng.randrange(10_000))]) for _ in range(13)]
        cats = [
            rng.choice(["", f"{rng.randrange(40) * 2654435761 % 2**32:08x}"]) for _ in range(26)
        ]
        lines.append("\t".join([str(int(rng.random() < 0.25)), *ints, *cats]))
    return "\n".join(lines) + "\n"


def files(root: Path) -> dict[str, bytes]:
    return {
        str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()
    }


def cli(*args: str, env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, "-m", "dmt.data.preprocess_cli", *args],
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO), **(env or {})},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )


def started_partial(proc: subprocess.Popen[bytes], out: Path) -> Path:
    """The partial output directory of the ``dmt-preprocess`` run ``proc`` writing ``out``,
    once its arrays exist (within 60 s, while it runs)."""
    partial = out.parent / f".{out.name}.partial-{socket.gethostname()}-{proc.pid}"
    deadline = time.monotonic() + 60
    while not (partial / "train" / "dense.npy").exists():
        assert proc.poll() is None, proc.communicate()[0].decode()
        assert time.monotonic() < deadline
        time.sleep(0.05)
    return partial


def children(pid: int) -> list[int]:
    out = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid:
            out.append(int(stat.parent.name))
    return out


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def test_cli_writes_output_and_reports_bad_input(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    raw = tmp_path / "train.txt"
    raw.write_text(raw_rows(200, seed=1))
    assert main([str(raw), str(tmp_path / "out"), "--no-progress", "--num-workers", "1"]) == 0
    assert "train" in capsys.readouterr().out
    assert read_manifest(tmp_path / "out")["splits"]["train"]["rows"] == 170
    bad = tmp_path / "bad.txt"
    bad.write_text(raw_rows(5, seed=2) + "1\t2\n")
    assert main([str(bad), str(tmp_path / "out2"), "--no-progress"]) == 1
    assert f"{bad.resolve()}:6: found 2 tab-separated field" in capsys.readouterr().err
    assert main([str(bad), str(tmp_path / "out2"), "--no-progress", "--skip-bad-rows"]) == 0
    assert read_manifest(tmp_path / "out2")["bad_rows"]["total"] == 1
    with pytest.raises(SystemExit) as refused:
        main([str(raw), str(tmp_path / "o3"), "--categorical-mode", "nope"])
    assert refused.value.code == 2
    assert "argument --categorical-mode: invalid choice: 'nope'" in capsys.readouterr().err
    assert not (tmp_path / "o3").exists()
    # reproduced bugs: tracebacks (FileExistsError; "cannot convert float NaN to integer")
    for args, message in (
        ([str(raw / "out")], f"output directory {raw / 'out'}: {raw} is not a directory"),
        ([str(tmp_path / "o6"), "--block-mib", "nan"], "--block-mib nan: expected a positive"),
        ([str(tmp_path / "o6"), "--unit-mib", "0"], "--unit-mib 0: expected a positive"),
    ):
        with pytest.raises(SystemExit) as refused:
            main([str(raw), *args, "--no-progress"])
        assert refused.value.code == 2
        assert f"error: {message}" in capsys.readouterr().err
    assert not (tmp_path / "o6").exists()
    # reproduced bugs: a reversed range of days was dropped without a word ...
    with pytest.raises(SystemExit):
        main([str(raw), str(tmp_path / "o4"), "--train-days", "0,7-3"])
    assert "'0,7-3': the range '7-3' is reversed (expected FIRST-LAST" in capsys.readouterr().err
    # ... a directory given as the one input of --vocab-from was said not to exist ...
    assert main([str(tmp_path), str(tmp_path / "o5"), "--vocab-from", str(tmp_path / "out")]) == 1
    assert f"input {str(tmp_path)!r} is a directory; expected one raw" in capsys.readouterr().err
    # ... and "." as the output directory made its temporary inside itself, then refused itself
    here = tmp_path / "here"
    here.mkdir()
    monkeypatch.chdir(here)
    assert main([str(raw), ".", "--no-progress", "--num-workers", "1"]) == 0
    assert read_manifest(here)["splits"]["train"]["rows"] == 170
    assert not [p.name for p in tmp_path.iterdir() if "partial" in p.name]


@pytest.mark.parametrize(
    "layout,rows,manifest,bad,error",
    [
        (  # the forward-in-time layout: train days, a validation day, a test day
            ["--train-days", "0-1", "--val-day", "2", "--eval-day", "3"],
            [70, 20, 10],
            {"train_days": [0, 1], "val_day": 2},
            ["--train-days", "0-2", "--val-day", "2", "--eval-day", "3"],
            "val_day 2 is also in train_days [0, 1, 2]; validation rows must not be trained on",
        ),
        (  # the refit layout: train days, no validation rows, the test day whole
            ["--train-days", "0-2", "--no-val", "--eval-day", "3"],
            [90, 0, 10],
            {"train_days": [0, 1, 2], "val_split": False},
            ["--train-days", "0-1", "--val-day", "2", "--no-val"],
            "val_split is false (no validation rows) but val_day 2 is set; set val_day to null, "
            "and put day 2 into train_days to train on it",
        ),
    ],
    ids=["val-day", "no-val"],
)
def test_cli_day_layouts(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    layout: list[str],
    rows: list[int],
    manifest: dict[str, object],
    bad: list[str],
    error: str,
) -> None:
    """``--val-day`` and ``--no-val``: the rows of each split, and the error of a bad layout."""
    days = tmp_path / "days"
    days.mkdir()
    for d, n in enumerate([40, 30, 20, 10]):
        (days / f"day_{d}.tsv").write_text(raw_rows(n, seed=10 + d))
    args = [str(days), str(tmp_path / "out"), "--no-progress", "--num-workers", "1"]
    assert main([*args, *layout]) == 0
    m = read_manifest(tmp_path / "out")
    assert [m["splits"][s]["rows"] for s in ("train", "val", "test")] == rows
    assert m["settings"]["layout"] == {"kind": "days", "eval_day": 3, **manifest}
    capsys.readouterr()
    assert main([*args, *bad]) == 1
    assert capsys.readouterr().err == f"dmt-preprocess: error: {error}\n"


# CI time (2 cores): a killed preprocessing and its rerun (10 s) run with -m slow
@pytest.mark.slow
def test_interrupted_run_then_rerun_equals_clean_run(tmp_path: Path) -> None:
    raw = tmp_path / "train.txt"
    raw.write_text(raw_rows(6000, seed=3))  # ~0.9 MB, cut into ~18 ranges below
    small = ["--block-mib", "0.02", "--unit-mib", "0.05", "--no-progress"]
    clean = preprocess_criteo(
        CriteoConfig(raw_path=str(raw), preprocessed_dir=str(tmp_path / "clean"), num_workers=1),
        progress=False,
    )

    out = tmp_path / "out"
    proc = cli(str(raw), str(out), "--num-workers", "2", *small, env={PAUSE_ENV: "0.5"})
    partial = started_partial(proc, tmp_path / "out")
    time.sleep(1.0)  # some ranges parsed, most not
    workers = children(proc.pid)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert not out.exists() and partial.exists()  # nothing that looks complete
    time.sleep(1.5)
    assert not [w for w in workers if alive(w)], "workers outlived their parent"

    rerun = cli(str(raw), str(out), "--num-workers", "2", *small)
    log = rerun.communicate(timeout=120)[0].decode()
    assert rerun.returncode == 0, log
    assert not partial.exists()
    assert files(out) == files(clean)


@pytest.mark.slow  # two preprocessing runs at once (about 20 s on 2 shared cores)
def test_a_run_that_finishes_second_does_not_replace_other_settings(tmp_path: Path) -> None:
    """Two runs on one output directory with different settings, started before either finished:
    the one that finishes second finds the other's output and refuses to replace it without
    --overwrite, as it would have at its start (a reproduced bug: it swapped its own in)."""
    raw = tmp_path / "train.txt"
    raw.write_text(raw_rows(400, seed=5))
    out = tmp_path / "out"
    args = [str(raw), str(out), "--no-progress", "--num-workers", "1"]
    slow = cli(*args, "--frequency-threshold", "1", env={PAUSE_ENV: "3"})
    partial = started_partial(slow, out)
    assert main([*args, "--frequency-threshold", "3"]) == 0
    assert slow.poll() is None  # still paused inside its build
    made = files(out)
    log = slow.communicate(timeout=120)[0].decode()
    assert slow.returncode == 1, log
    assert f"dmt-preprocess: error: output directory {str(out)!r} exists and was made with " in log
    assert "pass overwrite=True (--overwrite) to replace it" in log
    assert files(out) == made and read_manifest(out)["settings"]["categorical"] == {
        "mode": "vocab",
        "frequency_threshold": 3,
    }
    assert not partial.exists()


# -- the shared Criteo samples (skipped where ../shared/data is absent) -------------------------


def direct_counts(path: Path) -> tuple[int, int]:
    rows = clicks = 0
    with open(path, "rb") as f:
        for line in f:
            rows += 1
            clicks += line.startswith(b"1\t")
    return rows, clicks


def split_counts(path: Path, bounds: list[tuple[int, int]]) -> list[tuple[int, int]]:
    labels = [line.startswith(b"1\t") for line in path.read_bytes().splitlines()]
    return [(hi - lo, sum(labels[lo:hi])) for lo, hi in bounds]


@pytest.mark.criteo
@pytest.mark.skipif(not KAGGLE.is_file(), reason="needs ../shared/data/criteo-kaggle-sample")
def test_kaggle_sample(tmp_path: Path) -> None:
    n, clicks = direct_counts(KAGGLE)
    cfg = CriteoConfig(raw_path=str(KAGGLE), preprocessed_dir=str(tmp_path / "kaggle"))
    out = preprocess_criteo(cfg, progress=False)
    m = read_manifest(out)
    b1, b2 = round(n * 0.85), round(n * 0.925)
    expected = split_counts(KAGGLE, [(0, b1), (b1, b2), (b2, n)])
    for split, (rows, c) in zip(("train", "val", "test"), expected):
        assert m["splits"][split]["rows"] == rows
        assert m["splits"][split]["clicks"] == c
        assert m["splits"][split]["click_rate"] == pytest.approx(c / rows)
    assert sum(m["splits"][s]["clicks"] for s in m["splits"]) == clicks
    assert m["bad_rows"]["total"] == 0 and len(m["cardinalities"]) == 26
    assert all(c >= 2 for c in m["cardinalities"])
    src = CriteoSource(out / "val", batch_size=4096)
    labels = [x for b in src.batches(0) for x in b.labels.tolist()]
    assert sum(labels) == expected[1][1]


@pytest.mark.criteo
@pytest.mark.skipif(not KAGGLE.is_file(), reason="needs ../shared/data/criteo-kaggle-sample")
@pytest.mark.parametrize(
    ("data", "train_end", "val_end"),
    [("criteo_sample_forward", 0.8, 0.9), ("criteo_sample_forward_refit", 0.9, 0.9)],
)
def test_kaggle_sample_forward_protocol(
    tmp_path: Path, data: str, train_end: float, val_end: float
) -> None:
    """data=criteo_sample_forward: train on the first 80% of the lines, validate on the next 10%,
    test on the last 10%; data=criteo_sample_forward_refit: train on the first 90%, no
    validation, the same test rows. The splits, read back in order, are the file's rows in file
    order."""
    criteo = typed_config(f"data={data}").data.criteo
    assert criteo is not None
    assert (REPO / criteo.raw_path).resolve() == KAGGLE.resolve()
    out = preprocess_criteo(
        dataclasses.replace(criteo, raw_path=str(KAGGLE), preprocessed_dir=str(tmp_path / "fwd")),
        progress=False,
    )
    lines = KAGGLE.read_bytes().splitlines()
    n = len(lines)
    b1, b2 = round(n * train_end), round(n * val_end)
    m = read_manifest(out)
    assert [m["splits"][s]["rows"] for s in ("train", "val", "test")] == [b1, b2 - b1, n - b2]
    labels = np.array([line[:1] == b"1" for line in lines], dtype=np.int8)
    dense = np.array(
        [
            [math.log(max(int(x), 0) + 1) if x else 0.0 for x in line.split(b"\t")[1:14]]
            for line in lines
        ],
        dtype=np.float32,
    )
    for split, (lo, hi) in zip(("train", "val", "test"), [(0, b1), (b1, b2), (b2, n)]):
        if hi == lo:
            continue
        np.testing.assert_array_equal(np.load(out / split / "labels.npy"), labels[lo:hi])
        np.testing.assert_allclose(np.load(out / split / "dense.npy"), dense[lo:hi], rtol=1e-6)


@pytest.mark.criteo
@pytest.mark.skipif(not TB_HEAD.is_file(), reason="needs ../shared/data/criteo-1tb-day0-head")
def test_terabyte_head(tmp_path: Path) -> None:
    n, clicks = direct_counts(TB_HEAD)
    out = preprocess_criteo(
        CriteoConfig(raw_path=str(TB_HEAD), preprocessed_dir=str(tmp_path / "one")), progress=False
    )
    m = read_manifest(out)
    assert sum(m["splits"][s]["rows"] for s in m["splits"]) == n
    assert sum(m["splits"][s]["clicks"] for s in m["splits"]) == clicks
    # The day layout: the head as day 0 (train) and again as day 1 (validation/test halves).
    days = tmp_path / "days"
    days.mkdir()
    (days / "day_0.tsv").symlink_to(TB_HEAD.resolve())
    (days / "day_1.tsv").symlink_to(TB_HEAD.resolve())
    cfg = CriteoConfig(
        raw_path=str(days), preprocessed_dir=str(tmp_path / "tb"), train_days=[0], eval_day=1
    )
    m = read_manifest(preprocess_criteo(cfg, progress=False))
    half = math.ceil(n / 2)
    expected = [(n, clicks), *split_counts(TB_HEAD, [(0, half), (half, n)])]
    for split, (rows, c) in zip(("train", "val", "test"), expected):
        assert (m["splits"][split]["rows"], m["splits"][split]["clicks"]) == (rows, c)
    assert m["splits"]["train"]["click_rate"] == pytest.approx(clicks / n)


# -- safe outputs (issue 10): what --overwrite may replace, rows-less and damaged outputs --------


def test_cli_overwrite_never_deletes_the_input_or_other_files(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Bug: ``--overwrite`` deleted the directory holding the raw input, and unrelated files."""
    data = tmp_path / "data"
    data.mkdir()
    raw = data / "train.txt"
    raw.write_text(raw_rows(200, seed=4))
    (data / "notes.txt").write_text("mine")
    before = files(data)
    assert main([str(raw), str(data), "--overwrite", "--no-progress", "--num-workers", "1"]) == 1
    err = capsys.readouterr().err
    assert err == (
        f"dmt-preprocess: error: output directory {str(data)!r} contains the input {str(raw)!r}; "
        "dmt-preprocess never replaces a directory that holds its input: choose another output "
        "directory\n"
    )
    assert files(data) == before
    # the "exists" error for a directory dmt did not write never suggests --overwrite
    other = tmp_path / "other"
    other.mkdir()
    (other / "notes.txt").write_text("mine")
    for extra in ([], ["--overwrite"]):
        assert main([str(raw), str(other), "--no-progress", *extra]) == 1
        err = capsys.readouterr().err
        assert f"output directory {str(other)!r} exists and is not a dmt-preprocess output" in err
        assert "--overwrite" not in err and "overwrite=True" not in err
    assert files(other) == {"notes.txt": b"mine"}


def test_cli_all_rows_bad_exits_non_zero(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Bug: ``--skip-bad-rows`` on a CRLF file exited 0 with 0-row splits."""
    raw = tmp_path / "train.txt"
    raw.write_bytes(raw_rows(200, seed=5).replace("\n", "\r\n").encode())
    out = tmp_path / "out"
    assert main([str(raw), str(out), "--skip-bad-rows", "--no-progress", "--num-workers", "1"]) == 1
    err = capsys.readouterr().err.splitlines()[-1]  # after the log lines
    assert err.startswith(
        f"dmt-preprocess: error: no training rows: all 170 lines read for the train split of "
        f"{str(raw.resolve())!r} were malformed and dropped (170 bad rows, skip_bad_rows / "
        "--skip-bad-rows), so nothing was written; likely cause: the file has Windows (CRLF) "
        "line endings"
    ), err
    assert not out.exists() and not list(tmp_path.glob(".out.*"))


def test_cli_truncated_array_is_damaged_not_up_to_date(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Bug: a truncated ``train/sparse.npy`` in a complete output was reported up to date."""
    raw = tmp_path / "train.txt"
    raw.write_text(raw_rows(200, seed=6))
    out = tmp_path / "out"
    args = [str(raw), str(out), "--no-progress", "--num-workers", "1"]
    assert main(args) == 0
    good = files(out)
    sparse = out / "train" / "sparse.npy"
    size = sparse.stat().st_size
    os.truncate(sparse, size - 1000)
    capsys.readouterr()
    assert main(args) == 1
    assert capsys.readouterr().err == (
        f"dmt-preprocess: error: output directory {str(out)!r} is damaged: {sparse} is "
        f"{size - 1000:,d} bytes; its int32 (170, 26) needs {size:,d} bytes; pass "
        "overwrite=True (--overwrite) to rebuild it\n"
    )
    assert main([*args, "--overwrite"]) == 0
    assert files(out) == good


@pytest.mark.parametrize(
    ("layout", "extra", "message"),
    [
        ("file", ["--val-day", "5", "--hash-sizes", "1000"],
         "--val-day applies only to a directory of days, not to one input file; --hash-sizes "
         "applies only to --categorical-mode hash, not to vocab: they would be ignored; leave "
         "them out"),
        ("file", ["--val-day", "5", "--eval-day", "6"],
         "--eval-day, --val-day apply only to a directory of days, not to one input file: they "
         "would be ignored; leave them out"),
        ("days", ["--split-fractions", "0.5", "0.25", "0.25"],
         "--split-fractions applies only to one input file, not to a directory of days: it would "
         "be ignored; leave it out"),
        ("file", ["--categorical-mode", "hash", "--hash-sizes", "100", "--missing-id", "distinct"],
         "--missing-id applies only to --categorical-mode vocab, not to hash: it would be "
         "ignored; leave it out"),
        ("vocab-from", ["--frequency-threshold", "10"],
         "--frequency-threshold applies only without --vocab-from (its vocabularies and settings "
         "are the directory's): it would be ignored; leave it out"),
    ],
)  # fmt: skip
def test_options_the_input_would_not_read_are_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], layout: str, extra: list[str], message: str
) -> None:
    # a reproduced bug: they were dropped without a word (--val-day for one file, ...), and the
    # researcher believed the split or ids were the ones asked for
    raw = tmp_path / "train.tsv"
    raw.write_text(raw_rows(40, seed=0))
    args = [str(raw)]
    if layout == "days":
        (tmp_path / "days").mkdir()
        args = [str(tmp_path / "days")]
    elif layout == "vocab-from":
        assert main([str(raw), str(tmp_path / "made"), "--num-workers", "1", "--no-progress"]) == 0
        args += ["--vocab-from", str(tmp_path / "made")]
    with pytest.raises(SystemExit) as refused:
        main([*args, str(tmp_path / "out"), *extra])
    assert refused.value.code == 2
    assert capsys.readouterr().err.endswith(f"dmt-preprocess: error: {message}\n")
    assert not (tmp_path / "out").exists()
