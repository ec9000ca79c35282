"""Partition outputs (YAML, heatmap, summary) and the dmt-partition command."""

from __future__ import annotations

import numpy as np
import pytest
import yaml

from dmt.models.partition import check_partition, load_partition_file
from dmt.partitioner import (
    format_summary,
    load_partition,
    plot_affinity_heatmap,
    save_affinity,
    save_partition,
    tower_partition,
)
from dmt.partitioner.cli import main, run_partition
from dmt.partitioner.synthetic import planted_affinity

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


def test_cli_diverse_with_pre_groups(saved_affinity, tmp_path):
    path, _, _, names = saved_affinity
    groups_file = tmp_path / "groups.yaml"
    groups_file.write_text(yaml.safe_dump({"item": names[:8], "user": list(range(8, 12))}))
    out = tmp_path / "out"
    main(
        [
            "--affinity",
            str(path),
            "--num-towers",
            "3",
            "--strategy",
            "diverse",
            "--pre-groups",
            str(groups_file),
            "--out",
            str(out),
        ]
    )
    document = yaml.safe_load((out / "partition.yaml").read_text())
    assert document["pre_groups"] == [names[:8], names[8:]]
    assert sorted(len(tower) for tower in document["towers"]) == [4, 4, 4]
    for tower in document["towers"]:
        assert set(tower) <= set(names[:8]) or set(tower) <= set(names[8:])


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
