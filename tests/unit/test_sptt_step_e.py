"""Step e of the SPTT dataflow (dmt.sptt.dataflow._PlaceColumns): the same values, forward and
backward, as gluing step d's blocks side by side and selecting the tower's columns, without
processes (``torch.equal``; a zero gradient may keep its sign, which the former scatter-add into
zeros dropped)."""

from __future__ import annotations

import random

import pytest
import torch
from fbgemm_gpu.quantize_utils import fp32_to_fp16_with_clamp

from dmt.sptt.dataflow import MAX_STEP_E_COPIES, _PlaceColumns, _StepE
from dmt.sptt.plan import SHARDING_KINDS, build_plan
from dmt.sptt.splits import step_e_blocks
from dmt.sptt.topology import Topology


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("grad_scale", [1.0, 3.0])
@pytest.mark.parametrize("dim", [3, 8])
@pytest.mark.parametrize("max_copies", [0, MAX_STEP_E_COPIES])
@pytest.mark.parametrize("split", [True, False])
@pytest.mark.parametrize("wire", [None, torch.bfloat16, torch.float16])
def test_place_columns_equals_cat_and_index_select(
    seed: int, grad_scale: float, dim: int, max_copies: int, split: bool, wire: torch.dtype | None
) -> None:
    """Both forwards (a copy per run; glue and gather) and the backward, with tables split
    across ranks (``split``: random kinds, runs narrower than ``N``) and whole (table-wise:
    ``N`` columns at a time). ``wire``: the all-to-all's output as it came off a compressed
    wire (the reduce-scatter's stays fp32), against casting it back first, as step d did: the
    values, and gradients rounded once to the wire's dtype after the scale."""
    rng = random.Random(seed)
    topo = Topology(world_size=8, local_world_size=4)  # two towers of four ranks
    num_features, rows = 11, 5  # rows: T B
    features = list(range(num_features))
    rng.shuffle(features)
    towers = [features[:6], features[6:]]
    names = [f"cat_{f}" for f in range(num_features)]
    kinds = {n: rng.choice(SHARDING_KINDS) if split else "table_wise" for n in names}
    plan = build_plan(
        topo,
        names,
        towers,
        embedding_dim=dim,
        num_embeddings=[rng.randint(4, 50) for _ in names],
        sharding_types=kinds,
    )
    for rank in range(topo.world_size):
        t = topo.tower_of(rank)
        widths = [plan.all_to_all_width(q) for q in topo.tower_ranks(t)]
        summed_width = len(plan.row_wise_features(t)) * dim
        dtype = torch.float64 if wire is None else torch.float32
        sources = [torch.randn(rows * sum(widths), dtype=dtype).to(wire or dtype).requires_grad_()]
        if summed_width:
            sources.append(torch.randn(rows * summed_width, dtype=dtype, requires_grad=True))
        # the former step e: step d's blocks glued side by side (cast back), then the tower's
        # columns
        chunks = sources[0].to(dtype).split([rows * w for w in widths])
        blocks = [c.view(rows, w) for c, w in zip(chunks, widths)]
        if summed_width:
            blocks.append(sources[1].view(rows, summed_width))
        index = torch.tensor(plan.tower_column_index(t))
        expected = torch.cat(blocks, dim=1).index_select(1, index)
        grad = torch.randn_like(expected)
        expected_grads = torch.autograd.grad(expected, sources, grad * grad_scale)

        layout = _StepE(step_e_blocks(plan, rank), torch.device("cpu"), max_copies)
        assert (layout.runs is None) == (max_copies == 0)
        assert split or layout.unit == dim
        out = _PlaceColumns.apply(layout, grad_scale, dtype, *sources)
        grads = torch.autograd.grad(out, sources, grad)
        assert out.dtype == dtype and torch.equal(out, expected)
        for g, e, source in zip(grads, expected_grads, sources, strict=True):
            assert g.dtype == source.dtype and torch.equal(g, e)


def test_step_e_indices_are_unsaved_buffers() -> None:
    topo = Topology(world_size=2, local_world_size=2)
    names = ["cat_0", "cat_1", "cat_2"]
    plan = build_plan(topo, names, [[0, 1, 2]], embedding_dim=2, num_embeddings=[5, 5, 5])
    layout = _StepE(step_e_blocks(plan, 0), torch.device("cpu"), max_copies=0)
    assert layout.gather is not None  # rank 0 holds cat_0 and cat_2, rank 1 cat_1
    assert layout.unit == 2  # no table is split: whole rows of N = 2 columns move together
    assert layout.gather.tolist() == [0, 2, 1]  # tower feature -> glued feature
    assert dict(layout.named_buffers()).keys() >= {"gather"}
    assert layout.state_dict() == {}
    assert layout.to(torch.float64).gather.dtype == torch.int64  # indices stay indices
    copies = _StepE(step_e_blocks(plan, 0), torch.device("cpu"))
    assert copies.gather is None and copies.runs is not None
    assert [r.dest for r in copies.runs] == [0, 4, 2]  # cat_0, cat_2 (rank 0's), cat_1


@pytest.mark.parametrize("wire", [None, torch.bfloat16])
@pytest.mark.parametrize("max_copies", [0, MAX_STEP_E_COPIES])
def test_place_columns_takes_an_empty_batch(wire: torch.dtype | None, max_copies: int) -> None:
    """``T B = 0`` rows (a reproduced bug: the compressed backward viewed ``(0, -1)``)."""
    topo = Topology(world_size=2, local_world_size=2)
    names = ["cat_0", "cat_1", "cat_2"]
    plan = build_plan(topo, names, [[0, 1, 2]], embedding_dim=2, num_embeddings=[5, 5, 5])
    layout = _StepE(step_e_blocks(plan, 0), torch.device("cpu"), max_copies)
    source = torch.zeros(0, dtype=wire or torch.float32, requires_grad=True)
    out = _PlaceColumns.apply(layout, 3.0, torch.float32, source)
    assert out.shape == (0, 6) and out.dtype == torch.float32
    (grad,) = torch.autograd.grad(out, [source], torch.zeros(0, 6))
    assert grad.shape == (0,) and grad.dtype == source.dtype


@pytest.mark.parametrize("max_copies", [0, MAX_STEP_E_COPIES])
def test_place_columns_saturates_an_fp16_gradient(max_copies: int) -> None:
    """An fp16 wire's gradient beyond fp16's range goes back as +-65504, as TorchRec's fp16
    codec sends it (``fp32_to_fp16_with_clamp``), not as an infinity."""
    topo = Topology(world_size=2, local_world_size=2)
    names = ["cat_0", "cat_1", "cat_2"]
    plan = build_plan(topo, names, [[0, 1, 2]], embedding_dim=2, num_embeddings=[5, 5, 5])
    layout = _StepE(step_e_blocks(plan, 0), torch.device("cpu"), max_copies)
    rows, widths = 3, [plan.all_to_all_width(q) for q in topo.tower_ranks(0)]
    source = torch.randn(rows * sum(widths)).half().requires_grad_()
    out = _PlaceColumns.apply(layout, 2.0, torch.float32, source)
    grad = torch.randn(out.shape) * 1e5  # most entries overflow fp16 once scaled
    (got,) = torch.autograd.grad(out, [source], grad)
    # the reference: the blocks glued (in fp32), the tower's columns, the scaled gradient
    # back through them, then TorchRec's saturating cast
    leaf = source.detach().float().requires_grad_()
    blocks = [c.view(rows, w) for c, w in zip(leaf.split([rows * w for w in widths]), widths)]
    index = torch.tensor(plan.tower_column_index(0))
    (ref,) = torch.autograd.grad(torch.cat(blocks, dim=1).index_select(1, index), [leaf], grad * 2)
    assert got.dtype == torch.float16 and not torch.isinf(got).any()
    assert torch.equal(got, fp32_to_fp16_with_clamp(ref))
    assert torch.isinf((ref).half()).any()  # the plain cast would have overflowed


@pytest.mark.parametrize("max_copies", [0, MAX_STEP_E_COPIES])
def test_place_columns_of_a_tower_of_row_wise_tables_only(max_copies: int) -> None:
    """Step d's all-to-all brings no columns (an empty first source): the rows are those of
    the reduce-scatter's output, and step e places its columns in tower order."""
    topo = Topology(world_size=2, local_world_size=2)
    names = ["cat_0", "cat_1", "cat_2"]
    plan = build_plan(
        topo,
        names,
        [[2, 0, 1]],
        embedding_dim=2,
        num_embeddings=[5, 5, 5],
        sharding_types=dict.fromkeys(names, "row_wise"),
    )
    layout = _StepE(step_e_blocks(plan, 0), torch.device("cpu"), max_copies)
    rows = 3
    nothing = torch.zeros(0, requires_grad=True)
    summed = torch.randn(rows * 6, requires_grad=True)
    out = _PlaceColumns.apply(layout, 2.0, torch.float32, nothing, summed)
    index = torch.tensor(plan.tower_column_index(0))
    expected = summed.view(rows, 6).index_select(1, index)
    assert torch.equal(out, expected)
    grad = torch.randn(rows, 6)
    got = torch.autograd.grad(out, [nothing, summed], grad)
    assert got[0].shape == (0,)
    assert torch.equal(got[1], torch.autograd.grad(expected, [summed], grad * 2)[0])


@pytest.mark.parametrize("max_copies", [0, MAX_STEP_E_COPIES])
def test_place_columns_moves_uneven_column_blocks(max_copies: int) -> None:
    """``N = 5`` split in column blocks of 3 and 2: the blocks' offsets (0 and 3) share a
    divisor that the width 2 does not, so columns move one at a time."""
    topo = Topology(world_size=2, local_world_size=2)
    kinds = {"cat_0": "column_wise"}
    plan = build_plan(
        topo, ["cat_0"], [[0]], embedding_dim=5, num_embeddings=[7], sharding_types=kinds
    )
    layout = _StepE(step_e_blocks(plan, 0), torch.device("cpu"), max_copies)
    assert layout.unit == 1
    rows = 3
    source = torch.randn(rows * 5, dtype=torch.float64)
    blocks = [c.view(rows, w) for c, w in zip(source.split([rows * 3, rows * 2]), [3, 2])]
    expected = torch.cat(blocks, dim=1).index_select(1, torch.tensor(plan.tower_column_index(0)))
    assert torch.equal(_PlaceColumns.apply(layout, 1.0, torch.float64, source), expected)
