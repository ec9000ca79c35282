import pytest
import torch
from torchrec import EmbeddingBagCollection, KeyedJaggedTensor
from torchrec.models.dlrm import DLRM as TorchRecDLRM
from torchrec.models.dlrm import DLRM_DCN as TorchRecDLRM_DCN

from dmt.config import CrossInteractionConfig, DotInteractionConfig, ModelConfig
from dmt.models import (
    DLRM,
    CrossInteraction,
    DotInteraction,
    RecModel,
    build_model,
    embedding_tables,
)
from dmt.models.factory import table_sizes
from tests.conftest import typed_config

NAMES = [f"cat_{i}" for i in range(5)]
CARDS = [7, 11, 3, 20, 5]


def kjt(batch: int, multi_hot: int = 1, seed: int = 0) -> KeyedJaggedTensor:
    g = torch.Generator().manual_seed(seed)
    values = torch.cat([torch.randint(0, c, (batch * multi_hot,), generator=g) for c in CARDS])
    lengths = torch.full((len(NAMES) * batch,), multi_hot, dtype=torch.int32)
    return KeyedJaggedTensor(keys=NAMES, values=values, lengths=lengths)


INTERACTIONS = {  # what conf/model/{dlrm,dcn}.yaml set
    "dlrm": DotInteractionConfig(),
    "dcn": CrossInteractionConfig(num_layers=2, low_rank=4),
}


def tiny(name: str, pooling: str = "sum"):
    cfg = ModelConfig(
        name=name,
        interaction=INTERACTIONS[name],
        embedding_dim=8,
        bottom_mlp=[16, 8],
        top_mlp=[12, 1],
        dcn_num_layers=2,
        dcn_low_rank=4,
        pooling=pooling,
    )
    return build_model(cfg, feature_names=NAMES, cardinalities=CARDS, num_dense=3)


@pytest.mark.parametrize("name,cls", [("dlrm", DotInteraction), ("dcn", CrossInteraction)])
@pytest.mark.parametrize("multi_hot,pooling", [(1, "sum"), (3, "sum"), (3, "mean")])
def test_forward_shape_and_every_parameter_gets_a_gradient(name, cls, multi_hot, pooling):
    torch.manual_seed(0)
    model = tiny(name, pooling)
    assert isinstance(model, RecModel) and isinstance(model.interaction, cls)
    out = model(torch.randn(6, 3), kjt(6, multi_hot))
    assert out.shape == (6,)
    out.sum().backward()
    for pname, p in model.named_parameters():
        assert p.grad is not None and p.grad.abs().sum() > 0, pname


def test_dot_interaction_matches_explicit_pairs():
    torch.manual_seed(0)
    dense, sparse = torch.randn(4, 5), torch.randn(4, 3, 5)
    out = DotInteraction(num_vectors=3, dim=5)(dense, sparse)
    vecs = [dense] + [sparse[:, i] for i in range(3)]
    pairs = [(vecs[i] * vecs[j]).sum(1) for i in range(4) for j in range(i + 1, 4)]
    torch.testing.assert_close(out, torch.cat([dense, torch.stack(pairs, 1)], 1))


_GPU = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=_GPU)])
@pytest.mark.parametrize("V,D", [(3, 2), (3, 5), (6, 4), (1, 1)])  # D < V + 1 or not: both
def test_dot_interaction_backward_is_autograds(V, D, device):
    """The interaction's own backward (one batched product, ``(G + G^T) v``) gives autograd's
    gradients of the plain formulation (Gram matrix by ``bmm``, upper triangle), in float64
    to rounding and by ``gradcheck``; float32 to its rounding."""
    torch.manual_seed(0)
    it = DotInteraction(num_vectors=V, dim=D).double().to(device)
    f64 = {"dtype": torch.float64, "device": device}
    dense = torch.randn(4, D, **f64, requires_grad=True)
    sparse = torch.randn(4, V, D, **f64, requires_grad=True)
    weight = torch.randn(4, it.output_dim, **f64)

    def plain(d, s):
        v = torch.cat([d.unsqueeze(1), s], dim=1)
        rows, cols = torch.triu_indices(V + 1, V + 1, offset=1, device=device)
        return torch.cat([d, torch.bmm(v, v.transpose(1, 2))[:, rows, cols]], dim=1)

    ours = torch.autograd.grad((it(dense, sparse) * weight).sum(), (dense, sparse))
    ref = torch.autograd.grad((plain(dense, sparse) * weight).sum(), (dense, sparse))
    for a, b in zip(ours, ref):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)
    if D >= V + 1:  # the sparse gradient is its own product, which the lookup reads uncopied
        assert ours[1].is_contiguous()
    assert torch.autograd.gradcheck(it, (dense, sparse))
    f32 = [t.detach().float().requires_grad_() for t in (dense, sparse)]
    ours32 = torch.autograd.grad((it.float()(*f32) * weight.float()).sum(), f32)
    for a, b in zip(ours32, ref):
        torch.testing.assert_close(a.double(), b, rtol=1e-5, atol=1e-5)


def test_dot_interaction_backward_under_autocast_and_on_an_empty_batch():
    """Autocast's bf16 product, backward outside it (PyTorch's usage): the gradients in the
    inputs' dtype, near float32's (a reproduced bug: the bf16 gradient met the float32 vectors
    in one product and raised); an empty batch gives empty gradients."""
    torch.manual_seed(0)
    it = DotInteraction(num_vectors=4, dim=3)
    dense, sparse = torch.randn(8, 3, requires_grad=True), torch.randn(8, 4, 3, requires_grad=True)
    ref = torch.autograd.grad(it(dense, sparse).sum(), (dense, sparse))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = it(dense, sparse)
    grads = torch.autograd.grad(out.float().sum(), (dense, sparse))
    for g, r in zip(grads, ref):
        assert g.dtype == torch.float32
        torch.testing.assert_close(g, r, rtol=0.05, atol=0.05)
    empty = torch.zeros(0, 3, requires_grad=True), torch.zeros(0, 4, 3, requires_grad=True)
    grads = torch.autograd.grad(it(*empty).sum(), empty)
    assert [tuple(g.shape) for g in grads] == [(0, 3), (0, 4, 3)]


def test_dlrm_forward_equals_manual_composition():
    torch.manual_seed(0)
    model = tiny("dlrm")
    dense, sparse = torch.randn(4, 3), kjt(4)
    pooled = torch.stack(
        [
            model.embedding_bag_collection.embedding_bags[f"t_{n}"].weight[sparse[n].values()]
            for n in NAMES
        ],
        1,
    )
    x = model.bottom(dense)
    vecs = torch.cat([x[:, None], pooled], 1)
    gram = vecs @ vecs.transpose(1, 2)
    iu = torch.triu_indices(6, 6, 1)
    expected = model.top(torch.cat([x, gram[:, iu[0], iu[1]]], 1)).squeeze(1)
    torch.testing.assert_close(model(dense, sparse), expected)


@pytest.mark.parametrize("final_activation", [True, False])
def test_dlrm_with_final_bottom_relu_is_torchrecs_dlrm(final_activation):
    """With ``bottom_final_activation`` dmt's DLRM is TorchRec's (the model Meta's torchrec_dlrm
    trains, and benchmarks/bench_torchrec_dlrm.py's reference): the same parameters, layer by
    layer, and the same logits for the same weights; without it only the last ReLU differs."""
    cfg = ModelConfig(
        name="dlrm",
        interaction=DotInteractionConfig(),
        embedding_dim=8,
        bottom_mlp=[16, 8],
        top_mlp=[12, 6, 1],
        bottom_final_activation=final_activation,
    )
    torch.manual_seed(0)
    ours = build_model(cfg, feature_names=NAMES, cardinalities=CARDS, num_dense=3)
    theirs = TorchRecDLRM(
        embedding_bag_collection=EmbeddingBagCollection(tables=embedding_tables(NAMES, CARDS, 8)),
        dense_in_features=3,
        dense_arch_layer_sizes=[16, 8],
        over_arch_layer_sizes=[12, 6, 1],
    )
    _copy_parameters(ours, theirs)
    dense, sparse = torch.randn(6, 3), kjt(6, multi_hot=2)
    same = torch.allclose(ours(dense, sparse), theirs(dense, sparse).squeeze(-1))
    assert same == final_activation


def _copy_parameters(ours: torch.nn.Module, theirs: torch.nn.Module) -> None:
    """``theirs``'s parameters set to ``ours``'s, which must have the same shapes in order."""
    ours_params, theirs_params = list(ours.parameters()), list(theirs.parameters())
    assert [p.shape for p in ours_params] == [p.shape for p in theirs_params]
    with torch.no_grad():
        for a, b in zip(ours_params, theirs_params):
            b.copy_(a)


@pytest.mark.parametrize("name", ["paper_dlrm", "paper_dcn"])
def test_paper_models_are_torchrecs(name):
    """The paper's baselines are TorchRec's official DLRM and DCN (§5.1, "Strong Baseline"):
    ``experiment=paper_dlrm`` / ``paper_dcn`` (and the DMT rows built on them) build exactly
    ``torchrec.models.dlrm.DLRM`` / ``DLRM_DCN``, whose dense arch ends in a ReLU: the same
    parameters and logits for the same weights (the experiment's dense sizes, small tables). A
    reproduced bug: they kept dmt's default bottom MLP without that ReLU."""
    conf = typed_config(f"experiment={name}")
    m = conf.model
    torch.manual_seed(0)
    ours = build_model(m, feature_names=NAMES, cardinalities=CARDS, num_dense=13)
    ebc = EmbeddingBagCollection(tables=embedding_tables(NAMES, CARDS, m.embedding_dim))
    sizes = {
        "dense_in_features": 13,
        "dense_arch_layer_sizes": list(m.bottom_mlp),
        "over_arch_layer_sizes": list(m.top_mlp),
    }
    if name == "paper_dlrm":
        theirs = TorchRecDLRM(embedding_bag_collection=ebc, **sizes)
    else:
        theirs = TorchRecDLRM_DCN(
            embedding_bag_collection=ebc,
            dcn_num_layers=m.dcn_num_layers,
            dcn_low_rank_dim=m.dcn_low_rank,
            **sizes,
        )
    _copy_parameters(ours, theirs)
    dense, sparse = torch.randn(6, 13), kjt(6, multi_hot=2)
    torch.testing.assert_close(ours(dense, sparse), theirs(dense, sparse).squeeze(-1))


def test_dcn_uses_crossnet_over_dense_and_flattened_embeddings():
    model = tiny("dcn")
    assert model.interaction.in_features == 8 + len(NAMES) * 8
    assert model.top[0].in_features == 8 + len(NAMES) * 8


def test_dcn_forward_equals_manual_composition():
    """bottom(dense), then 2 low-rank (4) cross layers ``x_{l+1} = x_0 * (W_l V_l x_l + b_l) + x_l``
    over ``[bottom(dense), flattened pooled embeddings]`` in feature order, then the top MLP."""
    torch.manual_seed(0)
    model = tiny("dcn")
    cross = model.interaction.crossnet
    with torch.no_grad():  # biases start at zero: make them count
        for b in cross.bias:
            b.normal_()
    assert [tuple(v.shape) for v in cross.V_kernels] == [(4, 48), (4, 48)]
    assert [tuple(w.shape) for w in cross.W_kernels] == [(48, 4), (48, 4)]
    dense, sparse = torch.randn(4, 3), kjt(4)
    pooled = [
        model.embedding_bag_collection.embedding_bags[f"t_{n}"].weight[sparse[n].values()]
        for n in NAMES
    ]
    x0 = torch.cat([model.bottom(dense), *pooled], 1)  # (B, 8 + 5 * 8)
    x = x0
    for v, w, b in zip(cross.V_kernels, cross.W_kernels, cross.bias, strict=True):
        x = x0 * (x @ v.T @ w.T + b) + x
    expected = model.top(x).squeeze(1)
    torch.testing.assert_close(model(dense, sparse), expected)


def test_dlrm_rejects_bottom_mlp_not_ending_in_embedding_dim():
    ebc = EmbeddingBagCollection(tables=embedding_tables(NAMES, CARDS, 8))
    with pytest.raises(
        ValueError,
        match=r"DotInteraction: the dense vector has size 16 \(model.bottom_mlp\[-1\]\) but the sparse vectors have size 8",
    ):
        DLRM(ebc, num_dense=3, bottom_mlp=[16], top_mlp=[4, 1])


def test_table_sizes_must_match_features():
    with pytest.raises(ValueError, match="5 sparse features but 2 table sizes"):
        embedding_tables(NAMES, [3, 4], 8)


def test_a_table_smaller_than_its_features_ids_is_refused() -> None:
    """A reproduced bug: model.num_embeddings_per_feature below the data's cardinality trained
    on out-of-range ids with only TorchRec's warning."""
    names = ["cat_0", "cat_1"]
    cfg = ModelConfig(num_embeddings_per_feature=[100, 10])
    assert table_sizes(ModelConfig(), names, [100, 50]) == [100, 50]
    assert table_sizes(ModelConfig(num_embeddings_per_feature=[200, 60]), names, [100, 50]) == [
        200,
        60,
    ]
    with pytest.raises(ValueError) as err:
        table_sizes(cfg, names, [100, 50])
    assert str(err.value) == (
        "model.num_embeddings_per_feature[1] = 10 rows for cat_1, whose ids run to 49 (50 in the "
        "data): every id needs a row; set it to at least that, or leave "
        "model.num_embeddings_per_feature unset (the data's sizes)"
    )


def test_flop_accounting_counts_autograds_backward_and_leaves_the_fused_one():
    """``model_stats`` counts the interaction's backward as autograd's two products (the paper's
    convention), whichever backward the model trains with, and leaves the model's own (one
    product: fewer FLOPs, counted directly here) in place."""
    from torch.utils.flop_counter import FlopCounterMode

    from dmt.models.accounting import dense_flops

    model = tiny("dlrm")
    interaction = model.interaction
    assert isinstance(interaction, DotInteraction) and interaction.fused_backward
    counted = dense_flops(model)
    assert interaction.fused_backward  # restored
    interaction.fused_backward = False
    assert dense_flops(model) == counted
    interaction.fused_backward = True
    dense, sparse = torch.zeros(4, 8), torch.zeros(4, 5, 8, requires_grad=True)
    executed = FlopCounterMode(display=False)
    with executed:
        interaction(dense, sparse).sum().backward()
    B, n, D = 4, 6, 8
    assert executed.get_total_flops() == 2 * (2 * B * n * n * D)  # the Gram, then one product


def test_pooled_embeddings_in_feature_order_without_a_copy_when_already_in_order():
    from torchrec import KeyedTensor

    from dmt.models.rec_model import pooled_in_order

    B, N = 4, 3
    per_feature = {f: torch.randn(B, N, requires_grad=True) for f in NAMES}

    def keyed(order: list[str]) -> KeyedTensor:
        return KeyedTensor.from_tensor_list(order, [per_feature[f] for f in order])

    expected = torch.stack([per_feature[f] for f in NAMES], dim=1)
    in_order = keyed(NAMES)
    out = pooled_in_order(in_order, NAMES, N)
    assert torch.equal(out, expected)
    assert out.data_ptr() == in_order.values().data_ptr()  # a view of the lookup's output
    # a sharded EBC's plan order: permuted into the features' order, gradients routed back
    shuffled = keyed([NAMES[i] for i in (3, 0, 4, 1, 2)])
    out = pooled_in_order(shuffled, NAMES, N)
    assert torch.equal(out, expected)
    weights = torch.randn_like(out)
    (out * weights).sum().backward()
    for i, f in enumerate(NAMES):
        assert torch.equal(per_feature[f].grad, weights[:, i])
