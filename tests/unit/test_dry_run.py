"""dmt.planning.dry_run: one rank's real sharded modules of a 64- and 512-rank job, in one process.

Every dry run initializes and destroys its own default process group; each test checks that none
is left behind, so the global state cannot leak into other tests.
"""

from __future__ import annotations

import resource
import warnings

import pytest
import torch
import torch.distributed as dist
from torchrec.modules.embedding_modules import EmbeddingBagCollection

from dmt.inspect import schema
from dmt.models import DMTModel, build_model
from dmt.planning.dry_run import MIRROR_BACKEND, _world, dry_run
from dmt.sptt.topology import Topology
from tests.conftest import typed_config

L = 8  # ranks per host
B = 2  # local batch of the step


@pytest.fixture(autouse=True)
def no_process_group_left():
    assert not dist.is_initialized()
    yield
    assert not dist.is_initialized(), "a dry run left its process group behind"


def _plain(conf):
    names, cards, num_dense = schema(conf)
    return build_model(
        conf.model,
        feature_names=names,
        cardinalities=cards,
        num_dense=num_dense,
        table_device="meta",
        dense_device="meta",
    )


def _dense_params(model) -> int:
    tables = {
        id(p)
        for m in model.modules()
        if isinstance(m, EmbeddingBagCollection)
        for p in m.parameters()
    }
    return sum(1 for p in model.parameters() if id(p) not in tables)


def test_mirror_all_to_all_returns_what_identical_ranks_would_send():
    """Every rank holds ``x``; a real all-to-all brings rank ``me`` block ``me`` of every
    rank's ``x``, which is what the mirror returns, for uneven splits too."""
    G, me = 4, 1
    x = torch.arange(10)
    splits = [4, 3, 2, 1]
    with _world(MIRROR_BACKEND, rank=me, world_size=G, local_world_size=2):
        out = torch.full((G * splits[me],), -1)
        dist.all_to_all_single(
            out, x, output_split_sizes=[splits[me]] * G, input_split_sizes=splits
        )
        expected = torch.cat([x.split(splits)[me]] * G)
        torch.testing.assert_close(out, expected)
        # blocks of another size than this rank's own: only the size means something
        out = torch.full((6,), -1)
        dist.all_to_all_single(out, x, output_split_sizes=[3, 1, 1, 1], input_split_sizes=splits)
        torch.testing.assert_close(out, torch.tensor([4, 5, 6, 0, 0, 0]))


@pytest.mark.parametrize("G", [64, 512])
def test_dmt_at_scale(G):
    """paper_dmt_8t_dlrm on G ranks (K = G / (8 L) hosts per tower): the built module has the
    topology's towers and group sizes, the plan places every table, and one step gives logits
    (B,) and step f outputs shaped like the plain model's tower modules."""
    K = G // (8 * L)
    conf = typed_config("experiment=paper_dmt_8t_dlrm", "sptt=on", f"sptt.hosts_per_tower={K}")
    report = dry_run(conf, world_size=G, local_world_size=L, mode="dmt", rank=G - 1, batch_size=B)
    topology = Topology(world_size=G, local_world_size=L, hosts_per_tower=K)
    plain = _plain(conf)
    assert isinstance(plain, DMTModel)
    assert report.num_towers == topology.num_towers == len(plain.partition) == 8
    assert report.tower_group_size == topology.tower_size == K * L
    assert report.peer_group_size == topology.num_towers
    assert report.planned_tables == report.num_tables == len(plain.feature_names) == 26
    assert report.logits_shape == (B,) and report.loss_shape == ()
    N = conf.model.embedding_dim
    expected = []
    for tower, names in zip(plain.towers, plain.partition):
        out = tower.tower_module(torch.zeros(B, len(names), N, device="meta"))
        expected.append(tuple(out.shape))
    assert report.tower_output_shapes == expected
    # the dense arch's parameters and this rank's tower module's get their gradients
    tower_params = [len(list(t.tower_module.parameters())) for t in plain.towers]
    outside_towers = _dense_params(plain) - sum(tower_params)
    assert report.dense_grads == outside_towers + tower_params[topology.tower_of(G - 1)]


def test_dmt_full_size_tables_stay_on_meta():
    """Rank 0 of 64 holds a 23 GB table shard; building it allocates none of it."""
    conf = typed_config("experiment=paper_dmt_8t_dlrm", "sptt=on")
    report = dry_run(conf, world_size=64, local_world_size=L, mode="dmt", batch_size=B)
    rows, cols = zip(*[(r, c) for _, r, c in report.local_shards])
    assert report.local_table_gb == pytest.approx(sum(r * c for r, c in zip(rows, cols)) * 4 / 1e9)
    assert report.local_table_gb > 10 > report.max_rss_gb


def test_max_rss_gb_is_the_peak_resident_memory_in_gb():
    """``max_rss_gb`` is in the GB of ``local_table_gb`` (1e9 bytes): ``getrusage`` gives KiB."""
    conf = typed_config("experiment=paper_sptt_dlrm", "sptt=on")
    report = dry_run(conf, world_size=26 * L, local_world_size=L, mode="sptt")
    peak_bytes = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux: KiB
    assert report.max_rss_gb == pytest.approx(peak_bytes / 1e9, rel=1e-3)


@pytest.mark.parametrize("G", [64, 512])
def test_flat_at_scale(G):
    """paper_dlrm on G ranks: TorchRec's plan places all 26 tables, one step gives the pooled
    embeddings (B, F, N) after the output all-to-all, logits (B,) and a gradient for every dense
    parameter."""
    conf = typed_config("experiment=paper_dlrm")
    report = dry_run(conf, world_size=G, local_world_size=L, mode="flat", batch_size=B)
    plain = _plain(conf)
    assert report.planned_tables == report.num_tables == 26
    assert sum(report.sharding_types.values()) == 26
    assert report.logits_shape == (B,) and report.loss_shape == ()
    assert report.pooled_shape == (B, 26, conf.model.embedding_dim)
    assert report.dense_grads == _dense_params(plain)
    assert report.num_towers is None


def test_flat_builds_the_plans_sharding_types_and_names_those_the_cpu_cannot():
    """A reproduced bug: dmt-plan's dry run checked TorchRec's CPU plan, not the GPU cluster's
    plan it reported. The plan's sharding types are built where the CPU can build them (column-
    wise here); a type only CUDA has (table-row-wise) is named as substituted. And a row-wise
    SPTT plan, whose phase 2 one process cannot run, ended dmt-plan with NotImplementedError and
    no plan.json: phase 1 is reported, phase 2 as skipped."""
    conf = typed_config("experiment=paper_dlrm")
    names = [f"t_cat_{i}" for i in range(26)]
    types = {n: "table_row_wise" if i == 1 else "column_wise" for i, n in enumerate(names)}
    report = dry_run(
        conf, world_size=64, local_world_size=L, mode="flat", flat_sharding_types=types
    )
    assert report.planned_tables == 26
    assert report.sharding_types["column_wise"] >= 25
    (why,) = report.substituted.values()
    assert list(report.substituted) == ["t_cat_1"] and why.startswith("table_row_wise -> ")
    assert report.phase_2_skipped is None and report.logits_shape == (B,)
    sptt = typed_config(
        "experiment=dmt_4t_dlrm",
        "model.partition.num_towers=2",
        "sptt=on",
        "sptt.sharding_type=row_wise",
    )
    report = dry_run(sptt, world_size=4, local_world_size=2, mode="dmt")
    assert report.num_towers == 2 and report.phase_2_skipped is not None
    assert "sptt.sharding_type=row_wise" in report.phase_2_skipped
    assert report.logits_shape == () and not any(c.startswith("phase 2") for c in report.on_cpu)


@pytest.mark.parametrize(
    ("mode", "overrides"),
    [
        ("flat", []),
        ("dmt", ["experiment=dmt_4t_dlrm", "model.partition.num_towers=2", "sptt=on"]),
    ],
)
def test_the_dry_run_wraps_the_dense_part_as_training_does_without_ddps_warning(mode, overrides):
    """A reproduced bug: ``dmt-plan dry_run=true`` printed TorchRec's DDP ``FutureWarning``
    (`broadcast_buffers` is deprecated): its flat phase 2 wrapped the dense part in TorchRec's
    default DDP wrapper, not in :func:`dmt.sharding.data_parallel_wrapper`'s, as training does
    (which passes no argument that no setting reaches)."""
    conf = typed_config(*overrides)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        report = dry_run(conf, world_size=4, local_world_size=2, mode=mode)
    assert not [w for w in caught if "broadcast_buffers" in str(w.message)], caught
    assert report.phase_2_skipped is None and report.logits_shape == (B,)
    assert report.dense_grads > 0  # the step reached the dense part


def test_sptt_passthrough():
    """paper_sptt_dlrm: 26 pass-through towers of one feature, G = 26 L; step f brings every
    tower's (B, 1, N)."""
    conf = typed_config("experiment=paper_sptt_dlrm", "sptt=on")
    report = dry_run(conf, world_size=26 * L, local_world_size=L, mode="sptt", rank=5)
    assert report.num_towers == report.peer_group_size == 26
    assert report.tower_output_shapes == [(B, 1, conf.model.embedding_dim)] * 26


def test_tower_count_that_does_not_fit():
    conf = typed_config("experiment=paper_dmt_8t_dlrm", "sptt=on", "sptt.hosts_per_tower=2")
    with pytest.raises(ValueError, match=r"partition has 8 towers but the topology has T=4"):
        dry_run(conf, world_size=64, local_world_size=L, mode="dmt")


def test_world_not_divisible_by_tower_size():
    conf = typed_config("experiment=paper_dmt_8t_dlrm", "sptt=on", "sptt.hosts_per_tower=3")
    with pytest.raises(ValueError, match=r"G=64 must be a multiple of K\*L=3\*8=24"):
        dry_run(conf, world_size=64, local_world_size=L, mode="dmt")


def test_mode_must_fit_the_model():
    dmt_conf = typed_config("experiment=paper_dmt_8t_dlrm", "sptt=on")
    with pytest.raises(ValueError, match=r"mode='flat' dry-runs the base model"):
        dry_run(dmt_conf, world_size=64, local_world_size=L, mode="flat")
    with pytest.raises(ValueError, match=r"mode='sptt', but the model's towers are tower modules"):
        dry_run(dmt_conf, world_size=64, local_world_size=L, mode="sptt")
    with pytest.raises(ValueError, match=r"flat model dry-runs as rank 0 only"):
        dry_run(
            typed_config("experiment=paper_dlrm"),
            world_size=64,
            local_world_size=L,
            mode="flat",
            rank=3,
        )


def test_refuses_an_initialized_process_group():
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        with pytest.raises(
            RuntimeError, match=r"one is initialized \(backend 'gloo', world size 1\)"
        ):
            dry_run(
                typed_config("experiment=paper_dlrm"),
                world_size=64,
                local_world_size=L,
                mode="flat",
            )
        assert dist.is_initialized()  # not the dry run's to destroy
    finally:
        dist.destroy_process_group()


def test_model_that_does_not_fit_in_memory():
    """The full-size plans see the real tables: 10 GiB per rank cannot hold Criteo 1TB's
    largest table (22 GiB with its optimizer state), nor TorchRec's plan of paper_dlrm."""
    dmt_conf = typed_config("experiment=paper_dmt_8t_dlrm", "sptt=on", "sharding.ddr_gb=10")
    with pytest.raises(ValueError, match=r"does not fit on rank 0.*sharding.ddr_gb = 10 GiB"):
        dry_run(dmt_conf, world_size=64, local_world_size=L, mode="dmt")
    flat_conf = typed_config("experiment=paper_dlrm", "sharding.ddr_gb=10")
    with pytest.raises(ValueError, match=r"no sharding of the tables within the memory budget"):
        dry_run(flat_conf, world_size=64, local_world_size=L, mode="flat")
