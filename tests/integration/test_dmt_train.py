"""DMT-DLRM and DMT-DCN train through the Hydra app as well as their base models (issue 4)."""

from __future__ import annotations

import pytest
from torchrec import EmbeddingBagCollection
from torchrec.distributed.embeddingbag import ShardedEmbeddingBagCollection
from torchrec.distributed.model_parallel import DistributedModelParallel

from dmt.models import DMTModel
from dmt.train import train
from dmt.trainer import Trainer, unwrap
from tests.conftest import compose_config

QUIET = ["logger=disabled", "trainer.progress_bar=false"]
# 8 features in 2 planted groups, 30k samples: about 2 s a model on one core.
SMALL = [
    "data.synthetic.num_sparse=8",
    "data.synthetic.num_groups=2",
    "data.synthetic.num_train=30000",
    "data.synthetic.num_val=4000",
    "data.synthetic.num_test=8000",
    "data.batch_size=256",
]


def run(tmp_path, name: str, *overrides: str) -> dict[str, float]:
    return train(compose_config(*QUIET, *overrides), tmp_path / name)


@pytest.mark.parametrize(
    "base", ["dlrm", pytest.param("dcn", marks=pytest.mark.slow)]
)  # DCN: 20 s, with -m slow (CI time)
def test_dmt_model_trains_as_well_as_its_base_model(tmp_path, one_thread, base):
    plain = run(tmp_path, base, *SMALL, f"model={base}")
    dmt = run(tmp_path, f"dmt_{base}", *SMALL, f"experiment=dmt_4t_{base}")
    assert plain["test_auc"] > 0.65 and dmt["test_auc"] > 0.65, (plain, dmt)  # both learned
    assert dmt["test_auc"] >= plain["test_auc"] - 0.01, (plain["test_auc"], dmt["test_auc"])


@pytest.mark.slow
@pytest.mark.parametrize("base", ["dlrm", "dcn"])
def test_dmt_model_trains_as_well_as_its_base_model_on_the_default_data(tmp_path, one_thread, base):
    """The default planted data (26 features, 500k samples): about 20-35 s a model on one core."""
    plain = run(tmp_path, base, f"model={base}")
    dmt = run(tmp_path, f"dmt_{base}", f"experiment=dmt_4t_{base}")
    assert plain["test_auc"] >= plain["oracle_test_auc"] - 0.04, plain
    assert dmt["test_auc"] >= plain["test_auc"] - 0.01, (plain["test_auc"], dmt["test_auc"])


def test_trainer_builds_and_shards_the_dmt_model(tmp_path, one_thread):
    from dmt.runtime import close_runtime, init_runtime  # noqa: PLC0415
    from dmt.train import to_config  # noqa: PLC0415

    conf = to_config(compose_config(*QUIET, *SMALL, "experiment=dmt_4t_dlrm", "trainer=smoke"))
    rt = init_runtime("cpu")
    try:
        trainer = Trainer(conf, rt, tmp_path)
        model = unwrap(trainer.model)
        assert isinstance(model, DMTModel) and model.num_towers == 4
        assert model.partition == [
            ["cat_0", "cat_4"],
            ["cat_1", "cat_5"],
            ["cat_2", "cat_6"],
            ["cat_3", "cat_7"],
        ]
        # sharded by TorchRec: every tower's tables on the fused FBGEMM kernel (the sparse
        # optimizer runs in the backward), planned tower by tower, and the plan written
        assert isinstance(trainer.model, DistributedModelParallel)
        plan = trainer.model.plan.plan
        assert set(plan) == {f"model.towers.{t}.embedding_bag_collection" for t in range(4)}
        for t, features in enumerate(model.partition):
            assert isinstance(
                model.towers[t].embedding_bag_collection, ShardedEmbeddingBagCollection
            )
            tables = plan[f"model.towers.{t}.embedding_bag_collection"]
            assert set(tables) == {f"t_{f}" for f in features}
            assert all(p.compute_kernel == "fused" and p.ranks == [0] for p in tables.values())
        assert not any(
            isinstance(m, EmbeddingBagCollection) for m in trainer.model.modules()
        )  # no table left unsharded
        assert all(f"t_cat_{i}" in (tmp_path / "sharding_plan.txt").read_text() for i in range(8))
        losses = trainer.fit().losses
        assert len(losses) == 2 and all(loss > 0 for loss in losses)
    finally:
        close_runtime()
