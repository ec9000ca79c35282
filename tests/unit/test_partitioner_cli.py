"""Partition outputs (YAML, heatmap, summary) and the dmt-partition command."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import warnings
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import yaml

from dmt.config import PartitionConfig
from dmt.models.partition import check_partition, load_partition_file, resolve_partition
from dmt.partitioner import (
    PartitionResult,
    format_summary,
    load_partition,
    plot_affinity_heatmap,
    save_affinity,
    save_partition,
    tower_partition,
)
from dmt.partitioner import cli as partitioner_cli
from dmt.partitioner.cli import load_pre_groups, main, run_partition
from dmt.partitioner.synthetic import planted_affinity
from tests.conftest import REPO

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


@pytest.fixture
def saved_affinity(tmp_path):
    affinity, blocks = planted_affinity([4, 4, 4], seed=0)
    names = [f"cat_{i}" for i in range(12)]
    path = tmp_path / "affinity.npy"
    save_affinity(path, affinity, names)
    return path, affinity, blocks, names


def test_cli_end_to_end(saved_affinity, tmp_path, capsys):
    path, _, blocks, names = saved_affinity
    out = tmp_path / "out"
    assert (
        main(["--affinity", str(path), "--num-towers", "3", "--seed", "1", "--out", str(out)]) == 0
    )

    document = yaml.safe_load((out / "partition.yaml").read_text())
    assert document["num_towers"] == 3 and document["num_features"] == 12
    assert document["strategy"] == "coherent" and document["seed"] == 1
    assert document["affinity_source"] == str(path)
    assert 0.0 <= document["stress"] < 1.0
    towers = load_partition(out / "partition.yaml")
    assert towers == document["towers"]
    # Each tower is one planted block, named as in the sidecar.
    for tower in towers:
        assert len({int(blocks[names.index(name)]) for name in tower}) == 1
    # The model side reads the same file.
    assert load_partition_file(out / "partition.yaml") == towers
    check_partition(towers, names)

    png = (out / "affinity_heatmap.png").read_bytes()
    assert png.startswith(PNG_MAGIC) and len(png) > 5_000
    printed = capsys.readouterr().out
    assert "12 features -> 3 towers" in printed and "stress" in printed


def test_names_with_dollars_and_a_failed_heatmap_leave_no_half_partition(
    tmp_path, capsys, monkeypatch
):
    """Reproduced bugs: a feature named with two "$" failed in matplotlib's mathtext after
    partition.yaml was written (a rerun was then refused for it); a failure after the first
    file left it beside the old heatmap."""
    affinity, _ = planted_affinity([2, 2], seed=0)
    path = tmp_path / "m.npy"
    save_affinity(path, affinity, ["revenue_$_a_b_$", "b", "c", "d"])
    out = tmp_path / "new" / "out"
    assert main(["--affinity", str(path), "--num-towers", "2", "--out", str(out)]) == 0
    assert sorted(p.name for p in out.iterdir()) == ["affinity_heatmap.png", "partition.yaml"]
    assert "revenue_$_a_b_$" in (out / "partition.yaml").read_text()

    def fail(*args, **kwargs):
        raise OSError("No space left on device")

    monkeypatch.setattr(partitioner_cli, "plot_affinity_heatmap", fail)
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    args = ["--affinity", str(path), "--num-towers", "2", "--seed", "7", "--overwrite"]
    with pytest.raises(SystemExit):
        main([*args, "--out", str(out)])
    assert "No space left on device" in capsys.readouterr().err
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before  # the earlier, whole
    with pytest.raises(SystemExit):  # a new --out: nothing left, not even its folders
        main([*args, "--out", str(tmp_path / "other" / "out")])
    assert not (tmp_path / "other").exists()


@pytest.mark.parametrize("strategy", ["diverse", "coherent"])
def test_cli_pre_groups_and_strategy(tmp_path, strategy):
    """Pre-groups item = planted blocks 0 and 1, user = block 2, into 3 towers: the item group
    gets 2 towers. ``diverse`` spreads alike features over towers (each item tower holds
    features of both its blocks); ``coherent`` keeps each block together (one block a tower).
    Before, the test passed with either strategy."""
    affinity, blocks = planted_affinity([4, 4, 4], shuffle=False, seed=0)
    names = [f"cat_{i}" for i in range(12)]
    path = tmp_path / "affinity.npy"
    save_affinity(path, affinity, names)
    groups_file = tmp_path / "groups.yaml"
    groups_file.write_text(yaml.safe_dump({"item": names[:8], "user": list(range(8, 12))}))
    out = tmp_path / "out"
    argv = ["--affinity", str(path), "--num-towers", "3", "--strategy", strategy]
    assert main([*argv, "--pre-groups", str(groups_file), "--out", str(out)]) == 0
    document = yaml.safe_load((out / "partition.yaml").read_text())
    assert document["strategy"] == strategy
    assert document["pre_groups"] == [names[:8], names[8:]]
    assert sorted(len(tower) for tower in document["towers"]) == [4, 4, 4]
    item = [t for t in document["towers"] if set(t) <= set(names[:8])]
    user = [t for t in document["towers"] if set(t) <= set(names[8:])]
    assert len(item) == 2 and len(user) == 1  # no tower crosses the pre-groups
    for tower in item:
        planted = sorted(int(blocks[names.index(name)]) for name in tower)
        assert planted == ([0, 0, 1, 1] if strategy == "diverse" else [planted[0]] * 4)


def test_cli_reports_user_errors(saved_affinity, tmp_path, capsys):
    path, _, _, _ = saved_affinity
    with pytest.raises(SystemExit) as exit_info:
        main(["--affinity", str(path), "--num-towers", "13", "--out", str(tmp_path / "o")])
    assert exit_info.value.code == 2
    assert "num_towers must be between 1 and the number of features (12), got 13" in (
        capsys.readouterr().err
    )


def test_run_partition_returns_result(tmp_path):
    affinity, _ = planted_affinity([3, 3], seed=2)
    names = [f"f{i}" for i in range(6)]
    result = run_partition(affinity, names, 2, out_dir=tmp_path, affinity_source="ckpt")
    assert result.sizes == [3, 3]
    assert yaml.safe_load((tmp_path / "partition.yaml").read_text())["affinity_source"] == "ckpt"
    with pytest.raises(ValueError, match="got 5 feature names for a 6-feature affinity"):
        run_partition(affinity, names[:5], 2, out_dir=tmp_path)


def test_save_and_load_partition(tmp_path):
    affinity, _ = planted_affinity([2, 3], seed=0)
    result = tower_partition(affinity, 2, steps=50)
    names = ["a", "b", "c", "d", "e"]
    path = save_partition(tmp_path / "p.yaml", result, names)
    assert load_partition(path) == [[names[i] for i in tower] for tower in result.towers]

    (tmp_path / "bad.yaml").write_text("towers: [[a, b], [b]]\n")
    with pytest.raises(ValueError, match=r"features in more than one tower: \['b'\]"):
        load_partition(tmp_path / "bad.yaml")
    (tmp_path / "empty.yaml").write_text("strategy: coherent\n")
    with pytest.raises(ValueError, match="'towers' must be a non-empty list of non-empty lists"):
        load_partition(tmp_path / "empty.yaml")


def test_save_partition_writes_numpy_values_as_plain_ones(tmp_path):
    # Names from a NumPy array, a strategy picked from one and NumPy integer settings: the YAML
    # writer (yaml.safe_dump) raised RepresenterError on them after the partition was made.
    affinity, _ = planted_affinity([2, 3], seed=0)
    names = [f"cat_{i}" for i in range(5)]
    reference = tower_partition(affinity, 2, "diverse", seed=3, embed_dim=2, steps=50)
    result = PartitionResult(
        towers=reference.towers,
        strategy=np.array(["coherent", "diverse"])[1],
        seed=np.int64(3),
        stress=np.float64(reference.stress),
        coords=reference.coords,
        max_size_ratio=np.float64(1.0),
        embed_dim=np.int64(2),
    )
    path = save_partition(tmp_path / "numpy.yaml", result, np.array(names))
    expected = save_partition(tmp_path / "plain.yaml", reference, names)
    assert path.read_text() == expected.read_text()
    assert load_partition_file(path) == [[names[i] for i in tower] for tower in reference.towers]


def test_summary_table():
    affinity = np.array(
        [[1.0, 0.9, 0.1, 0.2], [0.9, 1.0, 0.3, 0.1], [0.1, 0.3, 1.0, 0.5], [0.2, 0.1, 0.5, 1.0]]
    )
    result = tower_partition(affinity, 2, steps=50)
    assert result.towers == [[0, 1], [2, 3]]
    summary = format_summary(result, affinity, ["a", "b", "c", "d"])
    lines = summary.splitlines()
    assert "4 features -> 2 towers" in lines[0]
    # Mean within-tower affinity (0.9 + 0.5) / 2 and across (0.1 + 0.2 + 0.3 + 0.1) / 4.
    assert "within towers 0.7000, across towers 0.1750" in lines[1]
    assert lines[3].split() == ["0", "2", "0.9000", "a,", "b"]
    assert lines[4].split() == ["1", "2", "0.5000", "c,", "d"]


def _drawn(monkeypatch) -> tuple[list[np.ndarray], list[tuple[float, float, float]]]:
    """Record what the heatmap draws: the images and each tower outline's (x, y, width)."""
    from matplotlib.axes import Axes  # noqa: PLC0415

    images: list[np.ndarray] = []
    boxes: list[tuple[float, float, float]] = []
    imshow, add_patch = Axes.imshow, Axes.add_patch

    def record_image(self, data, *args, **kwargs):
        images.append(np.asarray(data))
        return imshow(self, data, *args, **kwargs)

    def record_patch(self, patch):
        x, y = patch.get_xy()
        boxes.append((float(x), float(y), float(patch.get_width())))
        return add_patch(self, patch)

    monkeypatch.setattr(Axes, "imshow", record_image)
    monkeypatch.setattr(Axes, "add_patch", record_patch)
    return images, boxes


def test_heatmap_subsamples_large_matrices(tmp_path, monkeypatch):
    """1,400 features in 2 interleaved towers: drawn as 1,024 evenly spaced rows and columns of
    the tower-ordered matrix, the outlines in the subsampled image's coordinates."""
    affinity, _ = planted_affinity([700, 700], noise=0.0, seed=0)
    towers = [list(range(0, 1400, 2)), list(range(1, 1400, 2))]
    images, boxes = _drawn(monkeypatch)
    path = plot_affinity_heatmap(tmp_path / "big.png", affinity, towers)
    assert path.read_bytes().startswith(PNG_MAGIC)
    (image,) = images
    assert image.shape == (1024, 1024)
    order = np.concatenate(towers)
    picked = order[np.linspace(0, 1399, 1024).round().astype(np.int64)]
    np.testing.assert_array_equal(image, affinity[np.ix_(picked, picked)])
    split = int(np.searchsorted(np.linspace(0, 1399, 1024).round(), 700)) - 0.5
    assert boxes == [(-0.5, -0.5, split + 0.5), (split, split, 1023.5 - split)]
    assert abs(split - 511.5) <= 1


def test_heatmap_keeps_every_feature_of_a_small_matrix(tmp_path, monkeypatch):
    affinity, _ = planted_affinity([3, 3], noise=0.0, seed=0)
    towers = [[0, 2, 4], [1, 3, 5]]
    images, boxes = _drawn(monkeypatch)
    plot_affinity_heatmap(tmp_path / "small.png", affinity, towers)
    (image,) = images
    np.testing.assert_array_equal(image, affinity[np.ix_([0, 2, 4, 1, 3, 5], [0, 2, 4, 1, 3, 5])])
    assert boxes == [(-0.5, -0.5, 3.0), (2.5, 2.5, 3.0)]


def test_checkpoint_mode_errors(tmp_path, capsys):
    with pytest.raises(SystemExit) as missing:
        main(["--checkpoint", str(tmp_path / "nope"), "--num-towers", "2", "--out", str(tmp_path)])
    assert missing.value.code == 2
    assert f"--checkpoint {str(tmp_path / 'nope')!r}: no such directory" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(
            [
                "--checkpoint",
                str(tmp_path),
                "--max-batches",
                "0",
                "--num-towers",
                "2",
                "--out",
                str(tmp_path),
            ]
        )
    assert "--max-batches must be at least 1; got 0" in capsys.readouterr().err
    with pytest.raises(SystemExit):  # one source only
        main(
            [
                "--checkpoint",
                str(tmp_path),
                "--affinity",
                "a.npy",
                "--num-towers",
                "2",
                "--out",
                str(tmp_path),
            ]
        )
    assert "not allowed with argument" in capsys.readouterr().err
    assert not (tmp_path / "partition.yaml").exists()


def test_cli_never_replaces_an_earlier_partition_unless_asked(saved_affinity, tmp_path, capsys):
    path = saved_affinity[0]
    out = tmp_path / "out"
    argv = ["--affinity", str(path), "--num-towers", "3", "--out", str(out)]
    assert main(argv) == 0
    first = (out / "partition.yaml").read_bytes()
    with pytest.raises(SystemExit) as e:
        main([*argv[:-2], "--seed", "7", "--out", str(out)])
    assert e.value.code == 2
    assert capsys.readouterr().err.endswith(
        f"error: {out / 'partition.yaml'}, {out / 'affinity_heatmap.png'} exist already (an "
        "earlier partition); choose another --out, or pass --overwrite to replace them\n"
    )
    assert (out / "partition.yaml").read_bytes() == first
    assert main([*argv, "--seed", "7", "--overwrite"]) == 0
    assert yaml.safe_load((out / "partition.yaml").read_text())["seed"] == 7


NAMES = [f"cat_{i}" for i in range(12)]


class ModelLoaded(Exception):
    """Raised by the stand-in for loading a checkpoint's model (the start of the affinity pass)."""


@pytest.fixture
def fake_checkpoint(monkeypatch):
    """``--checkpoint`` of a run with features cat_0..cat_11, whose model is never loaded."""
    import dmt.evaluate as evaluate  # noqa: PLC0415

    monkeypatch.setattr(
        evaluate,
        "open_checkpoint",
        lambda path, config=None: SimpleNamespace(config="conf", path=Path(path)),
    )
    monkeypatch.setattr(evaluate, "run_schema", lambda conf: (list(NAMES), [5] * 12, 3))

    def load_model(ckpt, *args, **kwargs):
        raise ModelLoaded

    monkeypatch.setattr(evaluate, "load_model", load_model)


def write_pre_groups(tmp_path, text: str) -> Path:
    path = tmp_path / "groups.yaml"
    path.write_text(text)
    return path


@pytest.mark.parametrize(
    ("args", "groups", "message"),
    [
        (
            ["--num-towers", "20"],
            None,
            "num_towers must be between 1 and the number of features (12), got 20",
        ),
        (
            ["--num-towers", "3"],
            "item: [0, 1, 2, 3, 4, 5]\nuser: [5, 7, 8, 9, 10, 11]\n",
            "pre-groups file '{groups}': feature 'cat_5' is in pre-groups 0 and 1; pre-groups "
            "must be disjoint",
        ),
        (
            ["--num-towers", "2"],
            "[[cat_0, cat_1], [cat_2, cat_3], [4, 5, 6, 7, 8, 9, 10, 11]]\n",
            "num_towers must be between the number of pre-groups (3) and the number of features "
            "(12) so that every pre-group gets at least one tower, got 2",
        ),
        (
            ["--num-towers", "3", "--seed", "-1"],
            None,
            "--seed must be between 0 and 2**32 - 1 = 4294967295; got -1",
        ),
        (["--num-towers", "3", "--embed-dim", "0"], None, "--embed-dim must be at least 1; got 0"),
    ],
    ids=[
        "num-towers",
        "overlapping-pre-groups",
        "more-pre-groups-than-towers",
        "seed",
        "embed-dim",
    ],
)
def test_checkpoint_partition_arguments_are_checked_before_the_affinity(
    fake_checkpoint, tmp_path, capsys, args, groups, message
):
    """They used to fail only after the whole pass over the data (the model was loaded first)."""
    extra = []
    if groups is not None:
        extra = ["--pre-groups", str(write_pre_groups(tmp_path, groups))]
    out = tmp_path / "out"
    with pytest.raises(SystemExit) as exit_info:
        main(["--checkpoint", str(tmp_path), *args, *extra, "--out", str(out)])
    assert exit_info.value.code == 2
    expected = message.format(groups=tmp_path / "groups.yaml")
    assert capsys.readouterr().err.endswith(f"error: {expected}\n")
    assert not out.exists()


def test_an_out_that_is_a_file_is_refused_before_the_affinity(fake_checkpoint, tmp_path, capsys):
    # a reproduced bug: "[Errno 17] File exists" after the whole pass over the data
    out = tmp_path / "outfile"
    out.write_text("mine\n")
    with pytest.raises(SystemExit) as exit_info:
        main(["--checkpoint", str(tmp_path), "--num-towers", "3", "--out", str(out)])
    assert exit_info.value.code == 2
    assert capsys.readouterr().err.endswith(
        f"error: --out {str(out)!r} is a file; expected a folder (made if missing)\n"
    )
    assert out.read_text() == "mine\n"


def test_checkpoint_arguments_that_pass_the_check_reach_the_model(fake_checkpoint, tmp_path):
    groups = write_pre_groups(
        tmp_path, "item: [cat_0, cat_1, 2, 3, 4, 5]\nuser: [6, 7, 8, 9, 10, 11]\n"
    )
    argv = ["--checkpoint", str(tmp_path), "--pre-groups", str(groups), "--out", str(tmp_path)]
    with pytest.raises(ModelLoaded):
        main([*argv, "--num-towers", "4"])
    # An unreachable ratio only warns, and not in the check (the partition warns once).
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with pytest.raises(ModelLoaded):
            main([*argv, "--num-towers", "7", "--max-size-ratio", "1.5"])


@pytest.mark.parametrize(
    "option", [["--data", "val"], ["--max-batches", "2"], ["--batch-size", "8"], ["--config", "c"]]
)
def test_checkpoint_only_options_are_rejected_with_affinity(
    saved_affinity, tmp_path, capsys, option
):
    """They were silently ignored."""
    out = tmp_path / "out"
    argv = ["--affinity", str(saved_affinity[0]), "--num-towers", "3", "--out", str(out)]
    with pytest.raises(SystemExit) as exit_info:
        main([*argv, *option])
    assert exit_info.value.code == 2
    assert capsys.readouterr().err.endswith(
        f"error: {option[0]} can only be used with --checkpoint (to choose the data the affinity "
        "is computed from); --affinity reads an affinity that is computed already\n"
    )
    assert not out.exists()


@pytest.mark.parametrize(
    ("option", "message"),
    [
        (["--seed", "-1"], "--seed must be between 0 and 2**32 - 1 = 4294967295; got -1"),
        (
            ["--seed", str(2**32)],
            "--seed must be between 0 and 2**32 - 1 = 4294967295; got 4294967296",
        ),
        (["--embed-dim", "0"], "--embed-dim must be at least 1; got 0"),
    ],
    ids=["seed-negative", "seed-too-large", "embed-dim"],
)
def test_seed_and_embed_dim_errors_name_the_option(
    saved_affinity, tmp_path, capsys, option, message
):
    out = tmp_path / "out"
    argv = ["--affinity", str(saved_affinity[0]), "--num-towers", "3", "--out", str(out)]
    with pytest.raises(SystemExit) as exit_info:
        main([*argv, *option])
    assert exit_info.value.code == 2
    assert capsys.readouterr().err.endswith(f"error: {message}\n")
    assert not out.exists()


def test_pre_group_entries_are_feature_names_first(tmp_path):
    """YAML reads an unquoted 7 as an int; with features named "1".."12" it is the feature "7",
    not index 7 (which used to shift every group by one)."""
    groups = write_pre_groups(tmp_path, "item: [1, 2, 3, 4, 5, 6]\nuser: [7, 8, 9, 10, 11, 12]\n")
    numbered = [str(i) for i in range(1, 13)]
    assert load_pre_groups(groups, numbered) == [list(range(6)), list(range(6, 12))]
    # Integers that are not names are indices; names and indices mix.
    hundreds = [str(i) for i in range(100, 112)]
    by_name = write_pre_groups(
        tmp_path, "[[111, 100, 101], [102, 103, 104, 105, 106, 107, 108, 109, 110]]\n"
    )
    assert load_pre_groups(by_name, hundreds) == [[11, 0, 1], list(range(2, 11))]
    by_index = write_pre_groups(tmp_path, "[[11, 0, 1], [2, 3, 4, 5, 6, 7, 8, 9, 10]]\n")
    assert load_pre_groups(by_index, hundreds) == [[11, 0, 1], list(range(2, 11))]
    mixed = write_pre_groups(
        tmp_path, "item: [0, 1, cat_2, 3, 4, 5]\nuser: [cat_6, 7, 8, 9, 10, 11]\n"
    )
    assert load_pre_groups(mixed, NAMES) == [[0, 1, 2, 3, 4, 5], [6, 7, 8, 9, 10, 11]]


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (
            "item: [0, 1, 2, 3, 4, 5,\n",
            " is not valid YAML: expected the node content, but found '<stream end>' at line 2, "
            "column 1 (while parsing a flow node)",
        ),
        (
            "item: [0, 1, 2, 3, 4, 5]\nuser: [5, 7, 8, 9, 10, 11]\n",
            ": feature 'cat_5' is in pre-groups 0 and 1; pre-groups must be disjoint",
        ),
        (
            "item: [cat_0, cat_1]\nuser: [2, 3, 4]\n",
            ": pre-groups must cover every feature; 7 missing, first ['cat_5', 'cat_6', 'cat_7', "
            "'cat_8', 'cat_9']",
        ),
        (
            "item: [0, 1]\nuser: [2, 12]\n",
            ": pre-group 1 holds 12, neither a feature name nor a feature index in [0, 12)",
        ),
        (
            "item: [cat_0, 1.0]\n",
            ": unknown feature 1.0 in pre-group 0 (expected a feature name or index; features: "
            "cat_0..cat_11)",
        ),
        (
            "item: {a: 1}\n",
            ": pre-groups must be a list of lists (or a mapping of name -> list) of feature names "
            "or indices",
        ),
    ],
    ids=["yaml-syntax", "overlap", "missing", "index-out-of-range", "unknown", "not-a-list"],
)
def test_pre_group_errors_name_the_file_and_the_features(tmp_path, text, message):
    path = write_pre_groups(tmp_path, text)
    with pytest.raises(
        ValueError, match="^" + re.escape(f"pre-groups file {str(path)!r}{message}") + "$"
    ):
        load_pre_groups(path, NAMES)


def test_tp_partition_errors_name_the_option_and_file(tmp_path):
    """``model.partition.kind=tp``: what is wrong with the file says which file, and where from."""
    good = tmp_path / "p.yaml"
    good.write_text(yaml.safe_dump({"towers": [NAMES[:6], NAMES[6:]]}))
    empty = tmp_path / "empty.yaml"
    empty.write_text("towers: []\n")
    broken = tmp_path / "broken.yaml"
    broken.write_text("towers: [[cat_0, \n")
    cases = [
        (
            good,
            NAMES[:11],
            "feature 'cat_11' is not a sparse feature of the data (expected one of "
            "cat_0..cat_10); it is in partition tower 1",
        ),
        (empty, NAMES, "partition has no towers"),
        (
            broken,
            NAMES,
            f"partition file {str(broken)!r} is not valid YAML: expected the node content, but "
            "found '<stream end>' at line 2, column 1 (while parsing a flow node)",
        ),
    ]
    for path, names, message in cases:
        with pytest.raises(ValueError) as error:
            resolve_partition(PartitionConfig(kind="tp", path=str(path)), names)
        assert str(error.value) == f"model.partition.path={path}: {message}"


def test_a_file_that_appears_in_out_meanwhile_is_never_replaced(saved_affinity, tmp_path, capsys):
    """A reproduced bug: --out was checked for an earlier partition only at the start, and one
    that another dmt-partition wrote there meanwhile (a pass over the data takes minutes) was
    replaced without --overwrite."""
    out = tmp_path / "out"
    draw = partitioner_cli.plot_affinity_heatmap

    def draw_while_another_partition_lands(*args, **kwargs):
        out.mkdir(exist_ok=True)
        (out / "partition.yaml").write_text("the other partition's\n")
        return draw(*args, **kwargs)

    argv = ["--affinity", str(saved_affinity[0]), "--num-towers", "3", "--out", str(out)]
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(partitioner_cli, "plot_affinity_heatmap", draw_while_another_partition_lands)
        with pytest.raises(SystemExit) as exit_info:
            main(argv)
    assert exit_info.value.code == 2
    assert capsys.readouterr().err.endswith(
        f"error: {out / 'partition.yaml'} appeared while this partition was made (another "
        "dmt-partition with this --out?) and is kept, and none of this partition's files are "
        "written; choose another --out, or pass --overwrite to replace them\n"
    )
    assert sorted(p.name for p in out.iterdir()) == ["partition.yaml"]
    assert (out / "partition.yaml").read_text() == "the other partition's\n"
    assert main([*argv, "--overwrite"]) == 0
    assert sorted(p.name for p in out.iterdir()) == ["affinity_heatmap.png", "partition.yaml"]
    assert yaml.safe_load((out / "partition.yaml").read_text())["num_towers"] == 3


# dmt-partition stopped by SIGTERM (kill, timeout, a scheduler's) while it draws the heatmap,
# partition.yaml staged already
_STOPPED_WHILE_IT_DRAWS = """
import os, signal, sys
from dmt.partitioner import cli
draw = cli.plot_affinity_heatmap
def draw_then_stop(*args, **kwargs):
    os.kill(os.getpid(), signal.SIGTERM)
    return draw(*args, **kwargs)
cli.plot_affinity_heatmap = draw_then_stop
sys.exit(cli.main(sys.argv[1:]))
"""


@pytest.mark.slow  # several dmt-partition runs stopped at each stage (30-45 s on 2 shared cores)
def test_sigterm_leaves_no_staged_files_nor_folders_of_its_own(saved_affinity, tmp_path):
    """A reproduced bug: SIGTERM left the hidden staging folder (with a partition.yaml in it) in
    --out, and the folders dmt-partition had made for it."""
    out = tmp_path / "new" / "out"
    argv = ["--affinity", str(saved_affinity[0]), "--num-towers", "3", "--out", str(out)]
    res = subprocess.run(
        [sys.executable, "-c", _STOPPED_WHILE_IT_DRAWS, *argv],
        capture_output=True,
        text=True,
        timeout=300,
        env=dict(os.environ, PYTHONPATH=str(REPO)),
    )
    assert res.returncode == 128 + signal.SIGTERM, res.stderr[-3000:]
    assert res.stderr.endswith("dmt-partition: stopped by SIGTERM\n"), res.stderr[-3000:]
    assert not (tmp_path / "new").exists()
    assert main(argv) == 0  # and a retry works
    assert sorted(p.name for p in out.iterdir()) == ["affinity_heatmap.png", "partition.yaml"]


class UnhandledSigterm(Exception):
    """SIGTERM reached the test's own handler: dmt-partition had none of its own installed."""


@pytest.fixture
def sigterm_raises():
    """SIGTERM to this process raises :class:`UnhandledSigterm` where dmt-partition does not
    handle it (its default action would end pytest itself)."""

    def unhandled(signum, frame):
        raise UnhandledSigterm

    previous = signal.signal(signal.SIGTERM, unhandled)
    yield
    signal.signal(signal.SIGTERM, previous)


def _files(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in folder.iterdir()}


def test_sigterm_while_the_files_are_put_in_place_waits_until_all_are(
    saved_affinity, tmp_path, capsys, monkeypatch, sigterm_raises
):
    """A reproduced bug: SIGTERM between two of the renames left the new partition.yaml beside
    the earlier partition's heatmap."""
    argv = ["--affinity", str(saved_affinity[0]), "--num-towers", "3"]
    out, expected = tmp_path / "out", tmp_path / "expected"
    assert main([*argv, "--out", str(out)]) == 0
    assert main([*argv, "--seed", "7", "--out", str(expected)]) == 0
    assert _files(out) != _files(expected)
    capsys.readouterr()
    draw, replace = partitioner_cli.plot_affinity_heatmap, os.replace

    def replace_then_stop(src, dst):
        replace(src, dst)
        os.kill(os.getpid(), signal.SIGTERM)

    def draw_then_stop_in_place(*args, **kwargs):  # the last step before the files are placed
        path = draw(*args, **kwargs)
        monkeypatch.setattr(os, "replace", replace_then_stop)
        return path

    monkeypatch.setattr(partitioner_cli, "plot_affinity_heatmap", draw_then_stop_in_place)
    with pytest.raises(SystemExit) as exit_info:
        main([*argv, "--seed", "7", "--overwrite", "--out", str(out)])
    assert exit_info.value.code == 128 + signal.SIGTERM
    assert capsys.readouterr().err == "dmt-partition: stopped by SIGTERM\n"
    assert _files(out) == _files(expected)


def test_a_folder_given_for_a_file_is_named_as_one(saved_affinity, tmp_path, capsys):
    """A reproduced bug: dmt-partition's --out folder given as the partition (or the affinity)
    was reported as a file that "does not exist"."""
    out = tmp_path / "tp4"
    assert main(["--affinity", str(saved_affinity[0]), "--num-towers", "3", "--out", str(out)]) == 0
    with pytest.raises(ValueError) as error:
        resolve_partition(PartitionConfig(kind="tp", path=str(out)), NAMES)
    assert str(error.value) == (
        f"model.partition.path={out}: partition file {str(out)!r} is a folder; expected a "
        f"partition YAML file (dmt-partition --out {out} writes {str(out / 'partition.yaml')!r})"
    )
    with pytest.raises(SystemExit) as exit_info:
        main(["--affinity", str(out), "--num-towers", "3", "--out", str(tmp_path / "again")])
    assert exit_info.value.code == 2
    assert capsys.readouterr().err.endswith(
        f"error: affinity file {str(out)!r} is a folder; expected an affinity .npy file "
        f"(dmt-partition --checkpoint --out {out} writes {str(out / 'affinity.npy')!r})\n"
    )
