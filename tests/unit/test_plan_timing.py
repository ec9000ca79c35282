"""Step-time composition (dmt.planning.timing): compute, lookup, overlap budgets, speed-ups."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

from dmt.config import DLRMTowerConfig, DotInteractionConfig, ModelConfig, PartitionConfig
from dmt.models import build_dmt_model, build_model, naive_partition
from dmt.models.accounting import dense_flops, tower_train_flops
from dmt.models.interaction import DotInteraction
from dmt.planning.collectives import CollectiveBytes as Coll
from dmt.planning.hardware import ClusterConfig
from dmt.planning.network import collective_time_s
from dmt.planning.timing import (
    ComputeLoad,
    ModeWorkload,
    compute_load,
    lookup_passes,
    predict_modes,
    predict_step_time,
)

CLUSTER = ClusterConfig(
    name="test",
    hosts=2,
    gpus_per_host=2,
    gpu_memory_gb=16.0,
    dense_tflops=1.0,  # x 0.5 efficiency: 5e11 FLOP/s
    compute_efficiency=0.5,
    hbm_bandwidth_gbps=100.0,  # x 0.5: 5e10 B/s
    lookup_efficiency=0.5,
    intra_bandwidth_gbps=10.0,
    intra_latency_us=0.0,
    nic_bandwidth_gbps=1.0,  # 1e9 B/s
    nic_latency_us=0.0,
    ranks_per_nic=2,
)
# B = 100: dense 10 MFLOPs x 100 = 1e9 FLOPs -> 2 ms (bottom MLP 3 MFLOPs -> 0.6 ms);
# lookup 1e4 B x 100 = 1e6 B -> 0.02 ms
LOAD = ComputeLoad(
    dense_mflops_per_sample=10.0, bottom_mflops_per_sample=3.0, lookup_bytes_per_sample=1e4
)
B = 100


def _wire_ms(c: Coll, cluster: ClusterConfig = CLUSTER) -> float:
    local = 1 if c.group in ("peer", "cross") else min(c.group_size, cluster.gpus_per_host)
    return 1e3 * collective_time_s(
        c.op,
        group_size=c.group_size,
        ranks_per_host=local,
        intra_host_bytes=c.intra_host_bytes,
        cross_host_bytes=c.cross_host_bytes,
        intra=cluster.intra,
        inter=cluster.inter,
        ranks_per_nic=cluster.ranks_per_nic,
    )


def test_compute_and_lookup_alone() -> None:
    t = predict_step_time("flat", [], LOAD, B, CLUSTER)
    assert t.compute_ms == pytest.approx(2.0)
    assert t.lookup_ms == pytest.approx(0.02)
    assert t.total_ms == pytest.approx(2.02)
    assert t.collectives == ()


def test_exposed_collective_adds_its_wire_time() -> None:
    # step d: tower all-to-all, never hidden: 2 ranks per NIC x 1e6 B / 1e9 B/s = 2 ms
    d = Coll("d", "all_to_all", "tower", "forward", 4, 0, 1_000_000, False)
    t = predict_step_time("sptt", [d], LOAD, B, CLUSTER)
    assert t.collectives[0].time_ms == pytest.approx(2.0) == pytest.approx(_wire_ms(d))
    assert t.collectives[0].exposed_ms == t.collectives[0].time_ms
    assert t.total_ms == pytest.approx(2.02 + 2.0)


def test_an_all_to_all_lasts_as_long_as_its_busiest_receiver() -> None:
    # the forward's busiest sender (1e6 B across hosts) receives as much in the backward, whose
    # busiest sender sends 1e5 B: both directions take the 1e6 B time; an all-reduce is itself
    fwd = Coll("d", "all_to_all", "tower", "forward", 4, 300_000, 1_000_000, False)
    bwd = replace(fwd, direction="backward", intra_host_bytes=400_000, cross_host_bytes=100_000)
    ar = Coll("dense_allreduce", "all_reduce", "world", "backward", 4, 0, 100_000, True)
    t = predict_step_time("sptt", [fwd, bwd, ar], LOAD, B, CLUSTER)
    both = replace(fwd, intra_host_bytes=400_000)
    assert [c.time_ms for c in t.collectives] == pytest.approx(
        [_wire_ms(both), _wire_ms(both), _wire_ms(ar)]
    )
    alone = predict_step_time("sptt", [bwd], LOAD, B, CLUSTER)  # no forward: its own bytes
    assert alone.collectives[0].time_ms == pytest.approx(_wire_ms(bwd))


def test_prefetch_hides_input_all_to_all_up_to_the_step_compute() -> None:
    small = Coll("a", "all_to_all", "world", "forward", 4, 0, 500_000, True)  # 1 ms < 2.02 ms
    big = replace(small, cross_host_bytes=2_000_000)  # 4 ms: 2.02 ms hidden, 1.98 ms exposed
    for c, exposed in ((small, 0.0), (big, 4.0 - 2.02)):
        t = predict_step_time("sptt", [c], LOAD, B, CLUSTER)
        assert t.collectives[0].exposed_ms == pytest.approx(exposed)
        assert t.overlapped_ms == pytest.approx(_wire_ms(c) - exposed)
        assert t.total_ms == pytest.approx(2.02 + exposed)


def test_plain_loop_hides_nothing() -> None:
    c = Coll("a", "all_to_all", "world", "forward", 4, 0, 500_000, True)
    t = predict_step_time("sptt", [c], LOAD, B, CLUSTER, pipelined=False)
    assert t.exposed_ms == pytest.approx(1.0)
    assert t.total_ms == pytest.approx(3.02)


def test_not_overlappable_is_exposed_even_on_a_budgeted_step() -> None:
    c = Coll("a", "all_to_all", "world", "forward", 4, 0, 500_000, False)
    assert predict_step_time("sptt", [c], LOAD, B, CLUSTER).exposed_ms == pytest.approx(1.0)


def test_step_f_hides_behind_the_bottom_mlp_per_direction() -> None:
    # peer group, one rank per host: 1 step of 2 ranks per NIC x 250 kB = 0.5 ms each way;
    # bottom MLP 0.6 ms: forward 0.2 ms, backward 0.4 ms
    fwd = Coll("f", "all_to_all", "peer", "forward", 2, 0, 250_000, True)
    bwd = replace(fwd, direction="backward")
    t = predict_step_time("dmt", [fwd, bwd], LOAD, B, CLUSTER)
    assert [c.time_ms for c in t.collectives] == pytest.approx([0.5, 0.5])
    assert [c.exposed_ms for c in t.collectives] == pytest.approx([0.3, 0.1])


def test_collectives_share_one_budget_in_order() -> None:
    # two gradient all-reduces behind the backward (2/3 of 2 ms): the first is hidden, the
    # second gets what is left
    ar = Coll("dense_allreduce", "all_reduce", "world", "backward", 4, 0, 1_500_000, True)
    # hierarchical, S = 1e6 B: intra 2 x (S / 2) / 1e10 = 0.1 ms, inter 2 x 2 x (S / 2) / 2e9 = 1 ms
    assert _wire_ms(ar) == pytest.approx(1.1)
    tm = replace(ar, step="tower_allreduce")
    t = predict_step_time("dmt", [ar, tm], LOAD, B, CLUSTER)
    budget = 2.0 * 2 / 3
    assert [c.exposed_ms for c in t.collectives] == pytest.approx([0.0, 1.1 - (budget - 1.1)])


def test_all_budgets_come_out_of_one_step_compute() -> None:
    # the gradient all-reduce hides 1.1 ms behind the backward; step a then finds 2.02 - 1.1 ms
    # of the step's compute left, however large its own budget
    ar = Coll("dense_allreduce", "all_reduce", "world", "backward", 4, 0, 1_500_000, True)
    a = Coll("a", "all_to_all", "world", "forward", 4, 0, 1_000_000, True)  # 2 ms
    t = predict_step_time("sptt", [ar, a], LOAD, B, CLUSTER)
    assert [c.exposed_ms for c in t.collectives] == pytest.approx([0.0, 2.0 - (2.02 - 1.1)])
    assert t.overlapped_ms == pytest.approx(2.02)


def test_shared_cores_slow_compute_in_proportion() -> None:
    emulated = replace(CLUSTER, shared_cores=1, step_overhead_ms=1.0)  # 4 ranks on one core
    t = predict_step_time("flat", [], LOAD, B, emulated)
    assert (t.compute_ms, t.lookup_ms, t.overhead_ms) == pytest.approx((8.0, 0.08, 4.0))
    # intra-host copies too (loopback is CPU work), the NIC not: 1e8 B / (1e10 B/s / 4)
    d = Coll("d", "all_to_all", "tower", "forward", 4, 100_000_000, 0, False)
    assert predict_step_time("sptt", [d], LOAD, B, emulated).collectives[0].time_ms == (
        pytest.approx(40.0)
    )
    nic = Coll("d", "all_to_all", "tower", "forward", 4, 0, 1_000_000, False)
    assert predict_step_time("sptt", [nic], LOAD, B, emulated).collectives[0].time_ms == (
        pytest.approx(2.0)
    )


def test_a_step_hides_no_more_communication_than_it_computes() -> None:
    # step a (20 ms on the NIC) hides behind all of the step's 2.02 ms of compute and lookup;
    # the gradient all-reduce's own budget (the backward) is then spent too: it is all exposed
    a = Coll("a", "all_to_all", "world", "forward", 4, 0, 10_000_000, True)
    ar = Coll("dense_allreduce", "all_reduce", "world", "backward", 4, 0, 1_000_000, True)
    t = predict_step_time("sptt", [a, ar], LOAD, B, CLUSTER)
    assert t.overlapped_ms == pytest.approx(t.compute_ms + t.lookup_ms)
    assert t.collectives[1].exposed_ms == t.collectives[1].time_ms > 0


def test_more_shared_cores_than_ranks_run_at_full_speed() -> None:
    """A rank never gets more than its own core: ``min(1, shared_cores / G)``."""
    plenty = replace(CLUSTER, shared_cores=4 * CLUSTER.world_size, step_overhead_ms=1.0)
    alone = replace(CLUSTER, step_overhead_ms=1.0)
    d = Coll("d", "all_to_all", "tower", "forward", 4, 100_000_000, 0, False)
    assert predict_step_time("sptt", [d], LOAD, B, plenty) == predict_step_time(
        "sptt", [d], LOAD, B, alone
    )


def test_overheads() -> None:
    c = Coll("d", "all_to_all", "tower", "forward", 4, 0, 1_000_000, False)
    empty = replace(c, cross_host_bytes=0)  # issues nothing
    cluster = replace(CLUSTER, step_overhead_ms=1.5, collective_overhead_us=250.0)
    t = predict_step_time("sptt", [c, c, empty], LOAD, B, cluster)
    assert t.overhead_ms == pytest.approx(1.5 + 2 * 0.25)
    assert t.total_ms == pytest.approx(2.02 + 2 * 2.0 + 2.0)


def test_modes_and_speedups() -> None:
    out = Coll("flat_output_a2a", "all_to_all", "world", "forward", 4, 0, 1_000_000, False)
    d = Coll("d", "all_to_all", "tower", "forward", 4, 250_000, 0, False)
    times = predict_modes(
        {"flat": ModeWorkload([out], LOAD), "sptt": ModeWorkload([d], LOAD)}, B, CLUSTER
    )
    assert times["flat"].speedup_over_flat == 1.0
    assert times["sptt"].speedup_over_flat == pytest.approx(
        times["flat"].total_ms / times["sptt"].total_ms
    )
    assert times["flat"].exposed_by_step() == {"flat_output_a2a": pytest.approx(2.0)}


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (
            lambda: predict_step_time(
                "dmt",
                [Coll("z", "all_to_all", "world", "forward", 4, 0, 1, False)],
                LOAD,
                B,
                CLUSTER,
            ),
            "collective step='z' is unknown to the time model; expected one of ['a', "
            "'flat_input_a2a', 'f', 'dense_allreduce', 'tower_allreduce', 'd', 'flat_output_a2a']",
        ),
        (
            lambda: predict_step_time(
                "dmt", [Coll("d", "all_to_all", "row", "forward", 4, 0, 1, False)], LOAD, B, CLUSTER
            ),
            "group='row' is unknown to the time model; expected peer, cross, world, tower or host",
        ),
        (
            lambda: predict_step_time("tp", [], LOAD, B, CLUSTER),
            "mode='tp'; expected one of ['flat', 'sptt', 'dmt']",
        ),
    ],
)
def test_bad_input(call: object, message: str) -> None:
    with pytest.raises(ValueError) as err:
        call()  # type: ignore[operator]
    assert str(err.value) == message


def test_compute_load_checks() -> None:
    with pytest.raises(ValueError) as err:
        ComputeLoad(dense_mflops_per_sample=1.0, bottom_mflops_per_sample=2.0)
    assert str(err.value) == (
        "ComputeLoad.bottom_mflops_per_sample=2.0 exceeds dense_mflops_per_sample=1.0 (it is a part of it)"
    )
    with pytest.raises(ValueError) as err:
        ComputeLoad(1.0, bottom_mflops_per_sample=0.5, bottom_forward_mflops_per_sample=0.6)
    assert str(err.value) == (
        "ComputeLoad.bottom_forward_mflops_per_sample=0.6 must be >= 0 and at most "
        "bottom_mflops_per_sample=0.5 (it is a part of it)"
    )
    with pytest.raises(ValueError) as err:
        ComputeLoad(1.0, dense_forward_mflops_per_sample=1.5)
    assert str(err.value) == (
        "ComputeLoad.dense_forward_mflops_per_sample=1.5 must be >= 0 and at most "
        "dense_mflops_per_sample=1.0 (it is a part of it)"
    )


def _dlrm(bottom_mlp: list[int], num_features: int = 6):  # type: ignore[no-untyped-def]
    """A DLRM of 13 dense features and ``num_features`` tables, without towers."""
    names = [f"f{i}" for i in range(num_features)]
    cfg = ModelConfig(
        name="dlrm",
        interaction=DotInteractionConfig(),
        embedding_dim=bottom_mlp[-1],
        bottom_mlp=bottom_mlp,
        top_mlp=[16, 1],
        partition=PartitionConfig(kind="none"),
    )
    return build_model(cfg, feature_names=names, cardinalities=[10] * num_features, num_dense=13)


@pytest.mark.parametrize("bottom_mlp", [[16], [64, 16], [512, 256, 128]])
def test_bottom_mlp_flops_are_what_its_training_computes(bottom_mlp: list[int]) -> None:
    """Reproduced bug: dmt-plan counted the bottom MLP's training FLOPs as three times its
    forward, the gradient of the dense input too, which backward never computes: 1.5 times
    too many for one layer, 1.3% for the paper's 512-256-128. Counted here on the same MLP by
    PyTorch's FLOP counter, trained on an input that needs no gradient."""
    model = _dlrm(bottom_mlp)
    load = compute_load(model, ids_per_sample=6, sparse_optimizer="rowwise_adagrad")
    B = 4
    dense = torch.randn(B, 13)
    forward, training = FlopCounterMode(display=False), FlopCounterMode(display=False)
    with forward:
        model.bottom(dense)
    with training:
        model.bottom(dense).sum().backward()
    assert load.bottom_mflops_per_sample == pytest.approx(training.get_total_flops() / B / 1e6)
    assert load.bottom_forward_mflops_per_sample == pytest.approx(
        forward.get_total_flops() / B / 1e6
    )
    sizes = [13, *bottom_mlp]
    layers = [2 * i * o for i, o in zip(sizes, sizes[1:], strict=False)]
    assert load.bottom_mflops_per_sample == pytest.approx((3 * sum(layers) - layers[0]) / 1e6)


def test_step_f_backward_hides_behind_the_bottom_mlps_backward_as_computed() -> None:
    """A one-layer bottom MLP (13 -> 16) computes its weight gradient alone backward, as many
    FLOPs as its forward: step f's backward hides behind that, not twice its forward."""
    load = compute_load(_dlrm([16]), ids_per_sample=6, sparse_optimizer="rowwise_adagrad")
    batch = 1_000_000  # forward 2 x 13 x 16 FLOPs x 1e6 at 5e11 FLOP/s: 0.832 ms
    fwd = Coll("f", "all_to_all", "peer", "forward", 2, 0, 1_000_000, True)  # 2 ms each way
    bwd = replace(fwd, direction="backward")
    t = predict_step_time("dmt", [fwd, bwd], load, batch, CLUSTER)
    assert [c.exposed_ms for c in t.collectives] == pytest.approx([2.0 - 0.832, 2.0 - 0.832])


def _counted_flops(model, B: int = 4) -> tuple[float, float]:  # type: ignore[no-untyped-def]
    """(forward, forward + backward) FLOPs per sample of ``model``'s dense part by PyTorch's
    FLOP counter, its dot interactions backward as autograd computes it (the counted
    convention); the dense input needs no gradient, the pooled embeddings do."""
    for m in model.modules():
        if isinstance(m, DotInteraction):
            m.fused_backward = False
    dense = torch.randn(B, 13)
    pooled = torch.randn(B, model.num_features, model.embedding_dim, requires_grad=True)
    forward, training = FlopCounterMode(display=False), FlopCounterMode(display=False)
    with forward:
        model.dense_forward(dense, pooled)
    with training:
        model.dense_forward(dense, pooled).sum().backward()
    return forward.get_total_flops() / B, training.get_total_flops() / B


@pytest.mark.parametrize("bottom_mlp", [[16], [512, 256, 16]])
def test_gradient_allreduces_hide_behind_the_dense_backward_as_computed(
    bottom_mlp: list[int],
) -> None:
    """Reproduced bug: the gradient all-reduces hid behind two thirds of the dense training
    FLOPs, the gradient of the dense input too, which the bottom MLP's first layer never
    computes (13 x 16 x 2 / 3 FLOPs too many per sample for a 13 -> 16 bottom MLP). The
    backward is the training FLOPs less the forward, both counted by PyTorch's FLOP counter."""
    model = _dlrm(bottom_mlp)
    load = compute_load(model, ids_per_sample=6, sparse_optimizer="rowwise_adagrad")
    forward, training = _counted_flops(model)
    assert load.dense_forward_mflops_per_sample == pytest.approx(forward / 1e6)
    assert load.dense_mflops_per_sample == pytest.approx(training / 1e6)
    batch = 100_000
    backward_ms = (training - forward) * batch / 5e11 * 1e3
    ar = Coll("dense_allreduce", "all_reduce", "world", "backward", 4, 0, 10**9, True)
    assert _wire_ms(ar) > 2 * backward_ms  # longer than any budget of the step's backward
    t = predict_step_time("dmt", [ar], load, batch, CLUSTER)
    assert t.collectives[0].exposed_ms == pytest.approx(_wire_ms(ar) - backward_ms)


# a DLRM of 6 features of dim 16 whose towers project each feature to 8 (c = 1, p = 0)
_SMALL_DMT = ModelConfig(
    name="dlrm",
    interaction=DotInteractionConfig(),
    embedding_dim=16,
    bottom_mlp=[32, 8],
    top_mlp=[16, 1],
    tower=DLRMTowerConfig(dim=8, c=1, p=0),
    partition=PartitionConfig(kind="explicit"),
)


def test_compute_load_of_a_dmt_model() -> None:
    names = [f"f{i}" for i in range(6)]
    cfg = _SMALL_DMT
    model = build_dmt_model(
        cfg, naive_partition(names, 2), feature_names=names, cardinalities=[10] * 6, num_dense=13
    )
    load = compute_load(model, ids_per_sample=12, sparse_optimizer="rowwise_adagrad")
    # bottom MLP 13 -> 32 -> 8: forward 2 (13 x 32 + 32 x 8) FLOPs; backward both weight
    # gradients, and the input gradient of the second layer alone (the dense input needs none)
    assert load.bottom_forward_mflops_per_sample == pytest.approx(2 * (13 * 32 + 32 * 8) / 1e6)
    assert load.bottom_mflops_per_sample == pytest.approx(2 * (2 * 13 * 32 + 3 * 32 * 8) / 1e6)
    assert load.dense_mflops_per_sample == pytest.approx(dense_flops(model)[1] / 1e6)
    assert load.lookup_bytes_per_sample == 12 * 16 * 4 * 3  # ids x N x fp32 x (read, read, write)


def test_compute_load_counts_the_busiest_towers_module() -> None:
    """Reproduced bug: with towers of 4 and 2 features, a rank of the first runs its module
    (N -> D per feature: 6 N D training FLOPs a feature and sample) over T B samples, 4 x 2 x
    768 FLOPs per sample of its local batch, and the step waits for it (step f); dmt-plan
    charged the towers' mean, 6 x 768."""
    names = [f"f{i}" for i in range(6)]
    cfg = _SMALL_DMT
    towers = [names[:4], names[4:]]
    model = build_dmt_model(
        cfg, towers, feature_names=names, cardinalities=[10] * 6, num_dense=13, dense_device="meta"
    )
    per_feature = 6 * 16 * 8
    assert tower_train_flops(model) == [4 * per_feature, 2 * per_feature]
    mean = compute_load(model, ids_per_sample=12, sparse_optimizer="rowwise_adagrad")
    busiest = compute_load(
        model, ids_per_sample=12, sparse_optimizer="rowwise_adagrad", busiest_tower=True
    )
    assert mean.dense_mflops_per_sample == pytest.approx(dense_flops(model)[1] / 1e6)
    assert (busiest.dense_mflops_per_sample - mean.dense_mflops_per_sample) * 1e6 == (
        pytest.approx(2 * 4 * per_feature - 6 * per_feature)
    )
    assert busiest.bottom_mflops_per_sample == mean.bottom_mflops_per_sample
    # and its forward (2 N D FLOPs a feature and sample), the rest its backward
    assert mean.dense_forward_mflops_per_sample == pytest.approx(dense_flops(model)[0] / 1e6)
    assert busiest.dense_forward_mflops_per_sample is not None
    assert mean.dense_forward_mflops_per_sample is not None
    assert (
        busiest.dense_forward_mflops_per_sample - mean.dense_forward_mflops_per_sample
    ) * 1e6 == pytest.approx((2 * 4 - 6) * 2 * 16 * 8)


def _flat_model():  # type: ignore[no-untyped-def]
    """A DLRM of 6 features, N = 16, without towers."""
    names = [f"f{i}" for i in range(6)]
    cfg = ModelConfig(
        name="dlrm",
        interaction=DotInteractionConfig(),
        embedding_dim=16,
        bottom_mlp=[32, 16],
        top_mlp=[16, 1],
        partition=PartitionConfig(kind="none"),
    )
    return build_model(cfg, feature_names=names, cardinalities=[10] * 6, num_dense=13)


@pytest.mark.parametrize(
    ("optimizer", "passes"),
    [("sgd", 3), ("rowwise_adagrad", 3), ("adagrad", 5), ("adam", 7)],
)
def test_lookup_traffic_counts_the_sparse_optimizers_state(optimizer: str, passes: int) -> None:
    # the row read forward, read and written backward, and each per-element state tensor read
    # and written backward: 3 + 2 s passes of ids x N x 4 bytes
    model = _flat_model()
    load = compute_load(model, ids_per_sample=12, sparse_optimizer=optimizer)
    assert lookup_passes(optimizer) == passes
    assert load.lookup_bytes_per_sample == 12 * 16 * 4 * passes


def test_adam_lookup_time_exceeds_row_wise_adagrads_by_seven_thirds() -> None:
    model = _flat_model()
    times = {
        opt: predict_step_time(
            "flat", [], compute_load(model, ids_per_sample=12, sparse_optimizer=opt), B, CLUSTER
        )
        for opt in ("rowwise_adagrad", "adam")
    }
    # fused Adam reads and writes the weight and its two moments backward: (3 + 2 x 2) / 3
    assert times["adam"].lookup_ms == pytest.approx(times["rowwise_adagrad"].lookup_ms * 7 / 3)
    assert times["adam"].compute_ms == times["rowwise_adagrad"].compute_ms


def test_an_unknown_sparse_optimizer_is_named() -> None:
    with pytest.raises(ValueError, match="sparse optimizer 'lamb' is not one of"):
        lookup_passes("lamb")
