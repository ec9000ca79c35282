"""Benchmarks' results files (dmt/results.py): an earlier run's file is refused when the command
starts, unless --overwrite; files are written whole."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from dmt.results import existing_output, write_json


def test_an_existing_results_file_is_refused_unless_overwrite(tmp_path):
    path = tmp_path / "out.json"
    assert existing_output(None, "--json", overwrite=False) is None
    assert existing_output(path, "--json", overwrite=False) is None
    path.write_text("{}\n")
    assert existing_output(path, "--json", overwrite=False) == (
        f"--json {path} exists already (an earlier run's results); choose another file, or pass "
        "--overwrite to replace it"
    )
    assert existing_output(path, "--json", overwrite=True) is None


def test_an_output_under_a_file_is_refused_before_the_work(tmp_path):
    """Reproduced bug: ``--out notes.json/x.json`` passed the check, and dmt-eval failed after
    scoring every row (leaving its --predictions without a report); row_bootstrap.py after
    every resample, with a traceback."""
    (tmp_path / "notes.json").write_text("{}")
    for path in (tmp_path / "notes.json" / "x.json", tmp_path / "notes.json" / "a" / "x.json"):
        assert existing_output(path, "--out", overwrite=False) == (
            f"--out {path}: {tmp_path / 'notes.json'} is not a directory"
        )
    assert existing_output(tmp_path / "new" / "dir" / "x.json", "--out", False) is None


def test_overwrite_replaces_only_what_dmt_could_have_written(tmp_path):
    """--overwrite replaced any file: a user's notes, a directory's entry, even the command's
    own input."""
    notes = tmp_path / "notes.txt"
    notes.write_text("my notes\n")
    assert existing_output(notes, "--out", overwrite=True) == (
        f"--out {notes} exists and is not a JSON file, as dmt writes there (JSONDecodeError: "
        "Expecting value: line 1 column 1 (char 0)): not replaced, even with --overwrite; choose "
        "another file"
    )
    # a directory, with or without --overwrite (without, it was "an earlier run's results")
    for overwrite in (False, True):
        assert existing_output(tmp_path, "--out", overwrite=overwrite) == (
            f"--out {tmp_path} is a directory; give the path of a file"
        )
    link = tmp_path / "link.json"
    link.symlink_to(tmp_path / "elsewhere.json")  # dangling: writing would go through it
    assert "(not a regular file)" in existing_output(link, "--out", overwrite=True)
    (tmp_path / "elsewhere.json").write_text("{}")  # a link to JSON is no file dmt wrote either
    assert "(not a regular file)" in existing_output(link, "--out", overwrite=True)
    archive, array = tmp_path / "p.npz", tmp_path / "a.npy"
    np.savez(archive, prob=np.zeros(2), label=np.zeros(2))
    np.save(array, np.zeros(2))
    assert existing_output(archive, "--predictions", overwrite=True, kind="npz") is None
    assert "(a single array, not an archive)" in existing_output(
        array, "--predictions", overwrite=True, kind="npz"
    )
    assert "is not a NumPy .npz archive" in existing_output(
        notes, "--predictions", overwrite=True, kind="npz"
    )
    # the command's own input, whatever the spelling, with or without --overwrite
    report = tmp_path / "in.json"
    report.write_text("{}")
    for overwrite in (False, True):
        assert existing_output(
            tmp_path / "x" / ".." / "in.json", "--out", overwrite, inputs=[str(report)]
        ) == (f"--out {tmp_path / 'x' / '..' / 'in.json'} is one of the command's input files; "
              "write elsewhere")  # fmt: skip
    with pytest.raises(ValueError, match=r"^kind='csv' is not one of \['json', 'npz'\]$"):
        existing_output(report, "--out", overwrite=True, kind="csv")


def test_write_json_replaces_whole_and_leaves_no_temporary(tmp_path):
    path = tmp_path / "sub" / "out.json"
    write_json(path, [{"mode": "dmt", "ms_per_step": 1.5}])
    write_json(path, {"b": 2}, indent=1)
    assert json.loads(path.read_text()) == {"b": 2}
    assert sorted(p.name for p in path.parent.iterdir()) == ["out.json"]


def test_write_json_without_replace_keeps_a_file_that_appeared_meanwhile(tmp_path):
    """dmt-plan checks its directory, plans, then writes plan.json: a plan another run wrote
    there in between is not replaced (nor left with a temporary beside it)."""
    path = tmp_path / "plan.json"
    write_json(path, {"first": 1}, replace=False)
    with pytest.raises(FileExistsError, match=f"^{path} already exists: not replaced$"):
        write_json(path, {"second": 2}, replace=False)
    assert json.loads(path.read_text()) == {"first": 1}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["plan.json"]


def test_write_json_writes_standard_json(tmp_path):
    """A reproduced bug: seeds.json of one seed held a bare NaN (its std), which strict JSON
    readers refuse; every report goes through write_json, NaN and infinities as null."""
    path = tmp_path / "seeds.json"
    nan, inf = float("nan"), float("inf")
    write_json(path, {"std": nan, "runs": [{"auc": 0.7, "ne": inf}, (1.0, -inf)], "n": 1})
    text = path.read_text()
    assert "NaN" not in text and "Infinity" not in text
    assert json.loads(text) == {
        "std": None,
        "runs": [{"auc": 0.7, "ne": None}, [1.0, None]],
        "n": 1,
    }
    # metrics.json keeps NaN as a float (standard=False): the sweeps' and seeds' readers tell a
    # diverged run by its NaN logloss (dmt.trials.divergence), which a null would hide
    write_json(path, {"val_logloss": nan, "train_loss_last": inf}, standard=False)
    read = json.loads(path.read_text())
    assert math.isnan(read["val_logloss"]) and read["train_loss_last"] == inf
