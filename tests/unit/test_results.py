"""Benchmarks' results files (dmt/results.py): an earlier run's file is refused when the command
starts, unless --overwrite; files are written whole."""

from __future__ import annotations

import json

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
