"""``CommTrace`` measures what a training step really sends: on an SPTT step (G = 4 as two hosts
of two ranks) its bytes, total and cross-host, equal the dataflow's own ``CommStats`` on every
rank, and the dtype it sees on the wire is the ``comm_precision``'s; on the flat TorchRec
baseline it sees bf16 comms halve the pooled-embedding all-to-alls and nothing else."""

from __future__ import annotations

import pytest
import torch
from torchrec.datasets.utils import Batch
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

from dmt.config import OptimConfig
from dmt.models import embedding_parameters
from dmt.optim import apply_sparse_optimizer, build_optimizer
from dmt.runtime import Runtime
from dmt.sharding import shard_model
from dmt.sptt.comm_stats import CommStats
from dmt.sptt.comm_trace import CommTrace, TracedCall
from dmt.sptt.dmt_sharding import shard_dmt
from dmt.sptt.topology import Topology
from dmt.trainer import TrainTask
from tests.distributed.distributed_harness import run_on_ranks
from tests.distributed.small_dmt import NAMES, ROWS, F, small_dmt_model

G, L = 4, 2
B = 8
OPTIM = OptimConfig(
    sparse_lr=0.05,
    lr=0.01,
    sparse={
        "_target_": "torchrec.optim.RowWiseAdagrad",
        "_partial_": True,
        "lr": "${..sparse_lr}",
        "eps": 1e-8,
    },
    dense={"_target_": "torch.optim.SGD", "_partial_": True, "lr": "${..lr}"},
)


def _batch(rank: int, step: int) -> Batch:
    gen = torch.Generator().manual_seed(100 * rank + step)
    lengths = torch.randint(0, 3, (F * B,), generator=gen)
    return Batch(
        dense_features=torch.randn(B, 3, generator=gen),
        sparse_features=KeyedJaggedTensor.from_lengths_sync(
            keys=NAMES,
            values=torch.randint(0, ROWS, (int(lengths.sum()),), generator=gen),
            lengths=lengths,
        ),
        labels=torch.randint(0, 2, (B,), generator=gen).float(),
    )


def _step(module: torch.nn.Module, optimizer, batch: Batch) -> None:
    optimizer.zero_grad()
    loss, _ = module(batch)
    loss.backward()
    optimizer.step()


def _warm_up(module: torch.nn.Module, optimizer, rank: int) -> None:
    """Two steps: DDP's first syncs more than gradients, its second broadcasts rebuilt buckets."""
    for step in range(2):
        _step(module, optimizer, _batch(rank, step))


def _sent(calls: list[TracedCall], rank: int, hosts: Topology) -> tuple[int, int]:
    sent = cross = 0
    for call in calls:
        for dst, nbytes in zip(call.ranks, call.bytes_per_rank):
            if dst != rank:
                sent += nbytes
                cross += nbytes if hosts.crosses_host(rank, dst) else 0
    return sent, cross


def _sptt_worker(rank: int, world_size: int, precision: str) -> None:
    topo = Topology(world_size, L)  # two towers of one host each
    runtime = Runtime(rank, world_size, rank % L, L, torch.device("cpu"), "gloo")
    stats = CommStats(topo, rank)
    task, optimizer = shard_dmt(
        TrainTask(small_dmt_model(topo.num_towers, "dlrm")),
        runtime,
        topology=topo,
        optim_cfg=OPTIM,
        stats=stats,
        # a reduce-scatter (all-gather in the backward) next to the all-to-alls of step d
        sharding_type={"cat_0": "row_wise", "cat_1": "column_wise"},
        comm_precision=precision,
        even_batches=True,  # as in training: no batch-size all-reduce
    )
    _warm_up(task, optimizer, rank)
    stats.reset()
    trace = CommTrace(CommStats(topo, rank))
    with trace:
        _step(task, optimizer, _batch(rank, 2))
    assert not trace.unaccounted
    # TorchRec's step a first exchanges the split sizes (equal splits of ints), which the
    # dataflow leaves out of CommStats by design; everything else must agree byte for byte
    split_exchange = [c for c in trace.calls if c.op == "alltoall_base_" and not c.split_sizes]
    assert split_exchange and all(
        c.ranks == tuple(range(world_size)) and not c.dtype.is_floating_point
        for c in split_exchange
    )
    calls = [c for c in trace.calls if c not in split_exchange]
    expected = stats.total()
    assert _sent(calls, rank, topo) == (expected.bytes_sent, expected.bytes_cross_host)
    assert expected.bytes_cross_host > 0
    # steps d and f travel in the chosen precision; everything else as computed
    wire = {"fp32": torch.float32, "bf16": torch.bfloat16}[precision]
    tower, peers = tuple(topo.tower_ranks(topo.tower_of(rank))), tuple(topo.peers_of(rank))
    embedding = [c for c in calls if c.ranks in (tower, peers) and c.op != "allreduce_"]
    assert embedding and {c.dtype for c in embedding} == {wire}
    assert {c.dtype for c in calls if c.op == "allreduce_"} == {torch.float32}


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_trace_equals_sptt_comm_stats(precision: str) -> None:
    run_on_ranks(_sptt_worker, G, precision)


def _flat_worker(rank: int, world_size: int) -> dict[str, dict[str, int]]:
    runtime = Runtime(rank, world_size, rank % L, L, torch.device("cpu"), "gloo")
    hosts = Topology(world_size, L)
    out = {}
    for precision in ("fp32", "bf16"):
        model = small_dmt_model(1, "passthrough")
        apply_sparse_optimizer(embedding_parameters(model), OPTIM)
        dmp = shard_model(
            TrainTask(model), runtime, batch_size=B * world_size, comm_precision=precision
        )
        optimizer = build_optimizer(dmp, OPTIM)
        _warm_up(dmp, optimizer, rank)
        trace = CommTrace(CommStats(hosts, rank))
        with trace:
            _step(dmp, optimizer, _batch(rank, 2))
        assert not trace.unaccounted
        totals: dict[str, int] = {}
        for call in trace.calls:
            key = f"{call.op}/{call.dtype}".replace("torch.", "")
            totals[key] = totals.get(key, 0) + _sent([call], rank, hosts)[0]
        out[precision] = totals
    return out


def test_trace_sees_torchrec_quantized_comms() -> None:
    """World totals: bf16 halves the float all-to-alls of the flat baseline's tables (pooled
    embeddings and their gradients); ids and the dense all-reduce are unchanged."""
    per_rank = run_on_ranks(_flat_worker, G)
    totals = {
        p: {k: sum(r[p].get(k, 0) for r in per_rank) for k in per_rank[0][p]} for p in per_rank[0]
    }
    fp32, bf16 = totals["fp32"], totals["bf16"]
    assert fp32["alltoall_base_/float32"] > 0
    assert "alltoall_base_/float32" not in bf16
    assert bf16["alltoall_base_/bfloat16"] * 2 == fp32["alltoall_base_/float32"]
    rest = {k: v for k, v in fp32.items() if k != "alltoall_base_/float32"}
    assert rest == {k: v for k, v in bf16.items() if k != "alltoall_base_/bfloat16"}
    assert rest["allreduce_/float32"] > 0
