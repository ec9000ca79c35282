"""Tower Partitioner end to end (issue 3): train on planted data, partition from the checkpoint.

A DLRM is trained on planted synthetic data (12 features in 3 latent groups whose ids interact only
inside their group) with a checkpoint; ``dmt-partition --checkpoint`` computes the feature
affinity from the checkpoint's embeddings on the validation split and partitions into 3 towers.
The towers must recover the planted groups clearly better than the naive strided assignment
(adjusted Rand index), and a DMT model must train from the partition file.

The dot interaction rewards aligning the embeddings of features that interact, which is what the
affinity measures; embeddings of dim 32 (against latent vectors of dim 4) keep unrelated features
near orthogonal, and two epochs sharpen the alignment.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
import yaml
from sklearn.metrics import adjusted_rand_score

from dmt.data.synthetic import SyntheticWorld
from dmt.evaluate import load_model, open_checkpoint
from dmt.models import DMTModel
from dmt.partitioner import cli as partition_cli
from dmt.partitioner import naive_partition
from dmt.partitioner.affinity import load_affinity
from dmt.partitioner.cli import main as partition_main
from dmt.train import to_config, train
from tests.conftest import compose_config

FEATURES, GROUPS = 12, 3
PLANTED = [
    "logger=disabled",
    "trainer.progress_bar=false",
    f"data.synthetic.num_sparse={FEATURES}",
    f"data.synthetic.num_groups={GROUPS}",
    "data.synthetic.num_train=150000",
    "data.synthetic.num_val=4000",
    "data.synthetic.num_test=4000",
    "model.embedding_dim=32",
    "model.bottom_mlp=[64,32]",
    "trainer.epochs=2",
    "trainer.checkpoint=true",
]


def labels_of(towers: list[list[int]], num_features: int) -> np.ndarray:
    labels = np.full(num_features, -1)
    for tower, features in enumerate(towers):
        labels[features] = tower
    assert (labels >= 0).all()
    return labels


@pytest.mark.parametrize(
    "data_seed", [0, pytest.param(2, marks=pytest.mark.slow)]
)  # a second planted structure: 15 s, with -m slow
def test_tp_from_a_trained_checkpoint_recovers_the_planted_groups(
    tmp_path, one_thread, data_seed, capsys, monkeypatch
):
    overrides = [*PLANTED, f"data.synthetic.seed={data_seed}"]
    run = tmp_path / "run"
    metrics = train(compose_config(*overrides), run)
    assert metrics["test_auc"] > metrics["oracle_test_auc"] - 0.04, metrics  # it trained

    # Partition arguments that cannot work fail before the (long) affinity pass, not after it.
    def no_affinity(*args, **kwargs):
        raise AssertionError("the affinity was computed before the arguments were checked")

    groups = tmp_path / "groups.yaml"
    groups.write_text("item: [cat_0, cat_1, cat_2]\nuser: [cat_2, cat_3]\n")
    bad_arguments = [
        (["--num-towers", "20"], "num_towers must be between 1 and the number of features (12)"),
        (
            ["--num-towers", "2", "--pre-groups", str(groups)],
            f"pre-groups file {str(groups)!r}: feature 'cat_2' is in pre-groups 0 and 1",
        ),
    ]
    with monkeypatch.context() as patch:
        patch.setattr(partition_cli, "model_affinity", no_affinity)
        for args, message in bad_arguments:
            with pytest.raises(SystemExit) as exit_status:
                partition_main(
                    ["--checkpoint", str(run / "checkpoints"), *args, "--out", str(tmp_path / "x")]
                )
            assert exit_status.value.code == 2
            assert message in capsys.readouterr().err
    assert not (tmp_path / "x").exists()

    out = tmp_path / "tp"
    assert (
        partition_main(
            [
                "--checkpoint",
                str(run / "checkpoints"),
                "--data",
                "val",
                "--num-towers",
                str(GROUPS),
                "--out",
                str(out),
            ]
        )
        == 0
    )
    # a batch size of 0 is the user's error, named (it was a ZeroDivisionError)
    args = ["--checkpoint", str(run / "checkpoints"), "--num-towers", "2", "--batch-size", "0"]
    with pytest.raises(SystemExit) as exit_status:
        partition_main([*args, "--out", str(tmp_path / "none")])
    assert exit_status.value.code == 2
    assert "error: --batch-size must be >= 1; got 0" in capsys.readouterr().err
    document = yaml.safe_load((out / "partition.yaml").read_text())
    names = [f"cat_{i}" for i in range(FEATURES)]
    towers = [[names.index(f) for f in tower] for tower in document["towers"]]
    assert sorted(len(t) for t in towers) == [FEATURES // GROUPS] * GROUPS  # balanced
    assert "checkpoint" in document["affinity_source"]
    assert (out / "affinity_heatmap.png").stat().st_size > 0
    affinity, saved_names = load_affinity(out / "affinity.npy")
    assert saved_names == names and affinity.shape == (FEATURES, FEATURES)

    conf = to_config(compose_config(*overrides))
    planted = labels_of(SyntheticWorld(conf.data.synthetic).feature_groups, FEATURES)
    tp_ari = adjusted_rand_score(planted, labels_of(towers, FEATURES))
    naive_ari = adjusted_rand_score(planted, labels_of(naive_partition(FEATURES, GROUPS), FEATURES))
    # ARI 0.54 is one feature swapped between two towers; naive is near 0 (chance)
    assert tp_ari >= 0.5, (tp_ari, towers)
    assert tp_ari >= naive_ari + 0.4, (tp_ari, naive_ari)

    # the partition file is what DMT model configs consume
    dmt = train(
        compose_config(
            *[o for o in overrides if o.startswith(("data.", "logger", "trainer.p"))],
            "experiment=dmt_4t_dlrm",
            "partition=tp",
            f"model.partition.path={out / 'partition.yaml'}",
            "model.partition.num_towers=3",
            "trainer.max_steps=20",
            "trainer.checkpoint=true",
        ),
        tmp_path / "dmt",
    )
    assert json.loads((tmp_path / "dmt" / "metrics.json").read_text())["num_steps"] == 20
    assert dmt["test_auc"] > 0.5
    # the trained model's towers are the file's, tower by tower in its order
    trained = load_model(open_checkpoint(tmp_path / "dmt" / "checkpoints"))
    assert isinstance(trained, DMTModel)
    assert trained.partition == document["towers"]
