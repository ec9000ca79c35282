"""``sptt.comm_precision``: bf16/fp16 on the wire for SPTT's steps d and f and for the flat
baseline's TorchRec collectives.

SPTT: the outputs and gradients of a dataflow with tower modules equal the fp32 dataflow's within
the rounding of one cast per collective (and differ from them, so the cast happens), and the bytes
of steps d and f are exactly half of fp32's while step a's ids are untouched. Flat: the sharded
tables carry TorchRec's bf16 codecs and train to the fp32 losses within bf16's rounding.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from fbgemm_gpu.quantize_utils import fp32_to_fp16_with_clamp
from torchrec.distributed.embeddingbag import ShardedEmbeddingBagCollection
from torchrec.distributed.fbgemm_qcomm_codec import CommOp

from dmt.runtime import Runtime
from dmt.sptt.collectives import all_to_all_single, comm_dtype_of
from dmt.sptt.comm_stats import CommStats
from dmt.sptt.dataflow import SPTTDataflow
from dmt.train import compose_config, to_config
from dmt.trainer import Trainer
from tests.distributed.distributed_harness import backends, run_on_ranks
from tests.distributed.test_sptt_dataflow import CASES, B, Case, D, _setup, _TowerModule

LOW = {"bf16": torch.bfloat16, "fp16": torch.float16}

PRECISION_CASES = {
    # one tower of two ranks: step d (all-to-all and row-wise reduce-scatter) only
    "G2-L2-K1-cw-rw": Case(2, 2, 1, ((0, 1, 2, 3),), column_wise=(0,), row_wise=(1, 3)),
    # two towers of one rank: step f only
    "G2-L1-K1": Case(2, 1, 1, ((0, 2), (1,))),
    # both, with column- and row-wise shards
    "G4-L2-K1-cw-rw": CASES["G4-L2-K1-cw-rw"],
}


def _run(s, case: Case, precision: str, out_weights: list[torch.Tensor]):
    """One forward and backward of the dataflow with tower modules at ``precision``: the outputs,
    the shard and tower-module gradients, and the bytes counted (step f runs asynchronously, as
    in ``ShardedTowers``)."""
    towers = case.tower_features
    dims = [(len(fs) + 1, D) for fs in towers]
    stats = CommStats(s.topo, s.groups.rank)
    dataflow = SPTTDataflow(
        s.plan,
        s.tables,
        groups=s.groups,
        tower_output_dims=dims,
        stats=stats,
        comm_precision=precision,
    )
    dataflow.load_tables_from(s.reference)
    tower = s.topo.tower_of(s.groups.rank)
    module = _TowerModule(len(towers[tower]), seed=10 + tower)
    outputs = dataflow(s.local_kjt, tower_module=module)
    sum((o * w[s.lo : s.hi]).sum() for o, w in zip(outputs, out_weights)).backward()
    grads = [p.grad for _, p in dataflow.shard_parameters()]
    module_grads = [p.grad for p in module.parameters()]
    for g in module_grads:
        dist.all_reduce(g, group=s.groups.tower)
    return [o.detach() for o in outputs], grads, module_grads, stats.as_dict()


def _assert_rounded(got: torch.Tensor, ref: torch.Tensor, dtype: torch.dtype) -> None:
    """Equal within 4 units of roundoff of ``dtype`` at ``ref``'s largest magnitude (measured:
    at most 1.7 units, through a cast in step d, a tower module and a cast in step f)."""
    bound = 2 * torch.finfo(dtype).eps * ref.abs().max().item()
    torch.testing.assert_close(got, ref, rtol=0, atol=bound)


def _precision_worker(rank: int, world_size: int, case: Case) -> dict[str, dict[str, int]]:
    s = _setup(rank, world_size, case)
    gen = torch.Generator().manual_seed(3)
    dims = [(len(fs) + 1, D) for fs in case.tower_features]
    out_weights = [torch.randn(world_size * B, v, d, generator=gen) for v, d in dims]
    ref_out, ref_grads, ref_module_grads, ref_stats = _run(s, case, "fp32", out_weights)
    stats = {"fp32": ref_stats}
    for precision, dtype in LOW.items():
        out, grads, module_grads, stats[precision] = _run(s, case, precision, out_weights)
        for name, got, want in (
            ("outputs", out, ref_out),
            ("table grads", grads, ref_grads),
            ("tower module grads", module_grads, ref_module_grads),
        ):
            assert len(got) == len(want), name
            for g, w in zip(got, want):
                assert g.dtype == w.dtype == torch.float32, name
                _assert_rounded(g, w, dtype)
        # the cast happens: every tower's output went through step f, rounded
        assert all(not torch.equal(g, w) for g, w in zip(out, ref_out))
    return stats


@pytest.mark.parametrize("name", list(PRECISION_CASES))
def test_low_precision_dataflow_rounds_once_and_halves_bytes(name: str) -> None:
    case = PRECISION_CASES[name]
    stats = run_on_ranks(_precision_worker, case.world_size, case)
    for rank_stats in stats:
        fp32 = rank_stats["fp32"]
        for precision in LOW:
            low = rank_stats[precision]
            assert sorted(low) == sorted(fp32)
            for key, value in fp32.items():
                step, _, _, field = key.split("/")
                if step in ("d", "f") and field.startswith("bytes_"):
                    assert value % 2 == 0 and low[key] == value // 2, (precision, key)
                else:  # step a's ids, the calls, step c's local shuffles (fp32)
                    assert low[key] == value, (precision, key)
    # the cases do move bytes in the steps they cover
    totals = {
        step: sum(s["fp32"].get(f"{step}/forward/bytes_sent", 0) for s in stats)
        for step in ("d/tower", "f/peer")
    }
    topo_steps = {"G2-L2-K1-cw-rw": ("d/tower",), "G2-L1-K1": ("f/peer",)}
    for step in topo_steps.get(name, ("d/tower", "f/peer")):
        assert totals[step] > 0, step


def _cast_back_worker(rank: int, world_size: int, precision: str, backend: str) -> None:
    """``all_to_all_single(cast_back=False)`` then a cast to fp32 (what step e's copies do)
    equals ``cast_back=True``, forward and backward, bit for bit; its output is the wire's."""
    device = torch.device("cuda", rank) if backend == "nccl" else torch.device("cpu")
    gen = torch.Generator().manual_seed(rank)
    sizes = [3 + r for r in range(world_size)]  # uneven: rank r sends 3 + q elements to q
    received = [3 + rank] * world_size
    x = (torch.randn(sum(sizes), generator=gen) * 100).to(device)
    grad = (torch.randn(sum(received), generator=gen) * 100).to(device)
    outs, grads = [], []
    for cast_back in (True, False):
        leaf = x.clone().requires_grad_()
        out = all_to_all_single(
            leaf,
            output_split_sizes=received,
            input_split_sizes=sizes,
            group=dist.group.WORLD,
            comm_dtype=comm_dtype_of(precision),
            grad_scale=0.1,  # not a power of two: scaling in the wire's dtype would round
            cast_back=cast_back,
        )
        assert out.dtype == (torch.float32 if cast_back else LOW[precision])
        out = out.to(torch.float32)
        out.backward(grad)
        outs.append(out.detach())
        grads.append(leaf.grad)
    assert torch.equal(outs[0], outs[1])
    assert grads[1] is not None and grads[1].dtype == torch.float32
    assert torch.equal(grads[0], grads[1])


@pytest.mark.parametrize("backend", backends(min_gpus=2))
@pytest.mark.parametrize("precision", list(LOW))
def test_all_to_all_can_hand_over_the_wire_values(precision: str, backend: str) -> None:
    run_on_ranks(_cast_back_worker, 2, precision, backend, backend=backend)


def _saturation_worker(rank: int, world_size: int, backend: str) -> None:
    """fp16 on the wire: values beyond fp16's range arrive as +-65504, as TorchRec's fp16 codec
    sends them (``fp32_to_fp16_with_clamp``), not as infinities, forward and backward."""
    device = torch.device("cuda", rank) if backend == "nccl" else torch.device("cpu")
    big = torch.tensor([1e6, -1e6, 7e4, 1.5, float("nan"), 65519.0])
    n = big.numel()
    for cast_back in (True, False):
        leaf = big.to(device).requires_grad_()
        out = all_to_all_single(
            leaf,
            output_split_sizes=[n // world_size] * world_size,
            input_split_sizes=[n // world_size] * world_size,
            group=dist.group.WORLD,
            comm_dtype=torch.float16,
            cast_back=cast_back,
        )
        expected = fp32_to_fp16_with_clamp(big).float()  # every rank sends the same tensor
        expected = expected.view(world_size, -1)[rank].repeat(world_size)
        got = out.float().cpu()
        assert torch.isnan(got).tolist() == torch.isnan(expected).tolist()
        assert torch.equal(got.nan_to_num(), expected.nan_to_num())
        if cast_back:  # an fp32 gradient, cast by the collective (without: by step e, its test)
            out.backward(big.to(device).view(world_size, -1)[rank].repeat(world_size))
            assert leaf.grad is not None
            grad = leaf.grad.cpu()
            # rank q sends back chunk r of its gradient, chunk r of big: all of big arrives
            assert torch.equal(grad.nan_to_num(), fp32_to_fp16_with_clamp(big).float().nan_to_num())


@pytest.mark.parametrize("backend", backends(min_gpus=2))
def test_fp16_wire_saturates_as_torchrec_codec(backend: str) -> None:
    run_on_ranks(_saturation_worker, 2, backend, backend=backend)


# ---- the flat baseline: TorchRec's quantized comms ---------------------------------------------

FLAT = [
    "logger=disabled",
    "trainer.progress_bar=false",
    "data.synthetic.num_train=2048",
    "data.synthetic.num_val=256",
    "data.synthetic.num_test=256",
    "data.batch_size=256",
    "trainer.max_steps=8",
    "trainer.eval_max_batches=1",
    "model.embedding_dim=8",
    "model.bottom_mlp=[16,8]",
    "model.top_mlp=[16,1]",
]


def _flat_train(rank: int, world_size: int, precision: str, out: str):
    cfg = to_config(compose_config(*FLAT, f"sptt.comm_precision={precision}"))
    rt = Runtime(rank, world_size, rank, world_size, torch.device("cpu"), "gloo")
    trainer = Trainer(cfg, rt, Path(out))
    ebcs = [m for m in trainer.model.modules() if isinstance(m, ShardedEmbeddingBagCollection)]
    assert len(ebcs) == 1
    registry = ebcs[0].qcomm_codecs_registry or {}
    codecs = {
        op: (c.forward.quantized_dtype, c.backward.quantized_dtype) for op, c in registry.items()
    }
    return trainer.fit(keep_losses=True).losses, codecs


def test_flat_training_uses_torchrec_quantized_comms(tmp_path: Path) -> None:
    runs = {
        p: run_on_ranks(_flat_train, 2, p, str(tmp_path / p), timeout_s=240)
        for p in ("fp32", "bf16")
    }
    (fp32_losses, fp32_codecs), (bf16_losses, bf16_codecs) = runs["fp32"][0], runs["bf16"][0]
    assert fp32_codecs == {}
    pooled = CommOp.POOLED_EMBEDDINGS_ALL_TO_ALL.name
    assert bf16_codecs[pooled] == (torch.bfloat16, torch.bfloat16)
    assert bf16_codecs[CommOp.POOLED_EMBEDDINGS_REDUCE_SCATTER.name] == (
        torch.bfloat16,
        torch.bfloat16,
    )
    assert len(bf16_losses) == len(fp32_losses) == 8
    # the same training, within bf16's rounding of the pooled embeddings and their gradients
    torch.testing.assert_close(
        torch.tensor(bf16_losses), torch.tensor(fp32_losses), rtol=0, atol=2e-3
    )
    assert bf16_losses != fp32_losses
