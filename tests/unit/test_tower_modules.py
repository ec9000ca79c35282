"""Tower modules (paper Listings 1-2): shapes, output sizes, what they compute, compression ratios."""

from __future__ import annotations

import pytest
import torch

from dmt.config import (
    DCNTowerConfig,
    DLRMTowerConfig,
    DotInteractionConfig,
    ModelConfig,
    PassThroughTowerConfig,
)
from dmt.models import (
    DCNTowerModule,
    DLRMTowerModule,
    PassThrough,
    build_dmt_model,
    naive_partition,
)
from dmt.models.accounting import compression_ratio, tower_output_sizes


@pytest.mark.parametrize(
    "F,N,c,p,D",
    [
        (1, 8, 1, 0, 4),
        (3, 8, 1, 0, 4),
        (3, 8, 0, 1, 16),
        (4, 16, 2, 3, 5),
        (2, 4, 1, 1, 4),
        (5, 2, 0, 2, 3),
    ],
)
def test_dlrm_tower_module_is_listing_1(F, N, c, p, D):
    torch.manual_seed(0)
    tm = DLRMTowerModule(F, N, D, c=c, p=p)
    embs = torch.randn(7, F, N)
    out = tm(embs)
    assert out.shape == (7, c * F + p, D)
    assert (tm.num_vectors, tm.dim, tm.output_size) == (c * F + p, D, D * (c * F + p))
    # o1 = Linear(F N -> p D)(flatten), then o2 = Linear(N -> c D) per feature, concatenated.
    expected = []
    if p:
        expected.append(tm.tower_linear(embs.reshape(7, F * N)).reshape(7, p, D))
    if c:
        expected += [tm.feature_linear(embs[:, f]).reshape(7, c, D) for f in range(F)]
    torch.testing.assert_close(out, torch.cat(expected, dim=1))


@pytest.mark.parametrize(
    "F,N,D,layers,rank,c,p",
    [
        (1, 8, 4, 1, 2, 1, 0),
        (3, 8, 4, 2, 8, 1, 0),
        (4, 16, 32, 3, 64, 1, 0),
        (3, 8, 16, 1, 4, 0, 1),
        (2, 4, 4, 1, 2, 2, 1),
    ],
)
def test_dcn_tower_module_is_listing_2(F, N, D, layers, rank, c, p):
    torch.manual_seed(0)
    tm = DCNTowerModule(F, N, D, dcn_num_layers=layers, dcn_low_rank=rank, c=c, p=p)
    embs = torch.randn(7, F, N)
    out = tm(embs)
    V = c * F + p
    assert out.shape == (7, V, D) and tm.output_size == V * D
    assert len(tm.crossnet.V_kernels) == layers and tm.crossnet.V_kernels[0].shape == (rank, F * N)
    x0 = embs.reshape(7, F * N)
    x = x0
    for V_l, W, b in zip(tm.crossnet.V_kernels, tm.crossnet.W_kernels, tm.crossnet.bias):
        x = x0 * (x @ V_l.T @ W.T + b) + x
    torch.testing.assert_close(out, tm.projection(x).reshape(7, V, D))


@pytest.mark.parametrize(
    "make,linears",
    [
        # one feature, p=1, D=N: Linear(N -> N) left out; two features: Linear(2N -> N) kept
        (lambda s: DLRMTowerModule(1, 8, 8, c=0, p=1, skip_square=s), 1),
        (lambda s: DLRMTowerModule(2, 8, 8, c=0, p=1, skip_square=s), 0),
        # square (2N -> 2N) but over two features: it mixes them, so it stays (it was dropped)
        (lambda s: DLRMTowerModule(2, 8, 16, c=0, p=1, skip_square=s), 0),
        (lambda s: DLRMTowerModule(3, 8, 8, c=1, p=0, skip_square=s), 1),
        (lambda s: DLRMTowerModule(3, 8, 4, c=2, p=0, skip_square=s), 1),
        (lambda s: DLRMTowerModule(3, 8, 4, c=1, p=0, skip_square=s), 0),
        (
            lambda s: DCNTowerModule(
                1, 8, 8, dcn_num_layers=1, dcn_low_rank=2, c=0, p=1, skip_square=s
            ),
            1,
        ),
        (
            lambda s: DCNTowerModule(
                2, 8, 8, dcn_num_layers=1, dcn_low_rank=2, c=0, p=1, skip_square=s
            ),
            0,
        ),
        # Listing 2 as printed (c=1, p=0) with D = N: Linear(3N -> 3N) over three features mixes
        # them after the CrossNet, so it stays (it was dropped); over one feature it goes
        (
            lambda s: DCNTowerModule(
                3, 8, 8, dcn_num_layers=1, dcn_low_rank=2, c=1, p=0, skip_square=s
            ),
            0,
        ),
        (
            lambda s: DCNTowerModule(
                1, 8, 8, dcn_num_layers=1, dcn_low_rank=2, c=1, p=0, skip_square=s
            ),
            1,
        ),
    ],
)
def test_skip_square_leaves_out_only_square_linears(make, linears):
    def count(tm):
        return sum(isinstance(m, torch.nn.Linear) for m in tm.modules())

    full, skipped = make(False), make(True)
    assert count(full) - count(skipped) == linears
    embs = torch.randn(5, full.num_features, full.embedding_dim)
    assert skipped(embs).shape == full(embs).shape
    if isinstance(skipped, DLRMTowerModule) and linears and count(skipped) == 0:
        torch.testing.assert_close(skipped(embs).flatten(1), embs.flatten(1))


def test_passthrough_is_the_identity():
    tm = PassThrough(3, 8)
    embs = torch.randn(2, 3, 8)
    assert tm(embs) is embs and tm.output_size == 24
    with pytest.raises(ValueError, match=r"expects \(B, 3, 8\) embeddings, got \(2, 4, 8\)"):
        tm(torch.randn(2, 4, 8))


NAMES = [f"cat_{i}" for i in range(26)]


@pytest.mark.parametrize(
    "tower,num_towers,sizes,ratio",
    [
        # paper Table 5: 8 DLRM towers, c=1, p=0, N=128, D=64/32/16/8 -> CR 2/4/8/16
        (DLRMTowerConfig(dim=64, c=1, p=0), 8, [256, 256] + [192] * 6, 2.0),
        (DLRMTowerConfig(dim=32, c=1, p=0), 8, [128, 128] + [96] * 6, 4.0),
        (DLRMTowerConfig(dim=16, c=1, p=0), 8, [64, 64] + [48] * 6, 8.0),
        (DLRMTowerConfig(dim=8, c=1, p=0), 8, [32, 32] + [24] * 6, 16.0),
        # 16 towers, p=1, c=0, D=128: one 128-vector per tower
        (DLRMTowerConfig(dim=128, c=0, p=1), 16, [128] * 16, 26 / 16),
        (
            DLRMTowerConfig(dim=32, c=2, p=1),
            4,
            [32 * 15, 32 * 15, 32 * 13, 32 * 13],
            3328 / 1792,
        ),
        (
            DCNTowerConfig(dim=128, dcn_num_layers=1, dcn_low_rank=8),
            4,
            [896, 896, 768, 768],
            1.0,
        ),
        (DCNTowerConfig(dim=16, dcn_num_layers=1, dcn_low_rank=8), 2, [208, 208], 8.0),
        # paper Table 4 DCN reading: one 128-vector per tower
        (
            DCNTowerConfig(dim=128, dcn_num_layers=1, dcn_low_rank=8, c=0, p=1),
            4,
            [128] * 4,
            6.5,
        ),
        (PassThroughTowerConfig(), 3, [9 * 128, 9 * 128, 8 * 128], 1.0),
    ],
)
def test_tower_output_sizes_and_compression_ratio(tower, num_towers, sizes, ratio):
    bottom = getattr(tower, "dim", 128)  # pass-through towers keep N
    cfg = ModelConfig(
        name="dlrm",
        interaction=DotInteractionConfig(),
        embedding_dim=128,
        bottom_mlp=[bottom],
        top_mlp=[1],
        tower=tower,
    )
    model = build_dmt_model(
        cfg,
        naive_partition(NAMES, num_towers),
        feature_names=NAMES,
        cardinalities=[10] * 26,
        num_dense=2,
        table_device="meta",
        dense_device="meta",
    )
    assert tower_output_sizes(model) == sizes
    assert compression_ratio(model) == pytest.approx(ratio)


@pytest.mark.parametrize(
    "make,message",
    [
        (
            lambda: DLRMTowerModule(3, 8, 4, c=0, p=0),
            r"c=0 and p=0 must be integers >= 0 with c \+ p >= 1",
        ),
        (lambda: DLRMTowerModule(3, 8, 4, c=-1, p=2), r"c=-1 and p=2 must be"),
        (lambda: DLRMTowerModule(3, 8, 4, c=1, p=-1), r"c=1 and p=-1 must be"),
        (
            lambda: DLRMTowerModule(3, 8, 0, c=1, p=0),
            r"DLRMTowerModule: dim=0 must be a positive integer",
        ),
        (lambda: DLRMTowerModule(3, 8, -4, c=1, p=0), r"dim=-4 must be a positive integer"),
        (
            lambda: DCNTowerModule(3, 8, 0, dcn_num_layers=1, dcn_low_rank=2),
            r"DCNTowerModule: dim=0",
        ),
        (lambda: DCNTowerModule(3, 8, 4, dcn_num_layers=0, dcn_low_rank=2), r"dcn_num_layers=0"),
        (lambda: DCNTowerModule(3, 8, 4, dcn_num_layers=1, dcn_low_rank=0), r"dcn_low_rank=0"),
        (
            lambda: DCNTowerModule(3, 8, 4, dcn_num_layers=1, dcn_low_rank=2, c=0, p=0),
            r"DCNTowerModule: c=0 and p=0 must be integers >= 0 with c \+ p >= 1",
        ),
        (lambda: PassThrough(0, 8), r"PassThrough: num_features=0"),
        (
            lambda: DLRMTowerModule(3, 8, 4, c=1, p=0, init="xavier"),
            r"model.tower.init='xavier': expected one of default, isometric",
        ),
    ],
)
def test_invalid_tower_module_settings_raise(make, message):
    with pytest.raises(ValueError, match=message):
        make()


@pytest.mark.parametrize("N,D", [(8, 8), (8, 4), (4, 8)])
def test_isometric_init_keeps_the_dot_interaction(N, D):
    """``init="isometric"``: with ``D >= N`` the feature projection keeps every dot product of
    the pooled embeddings (the tower module starts as the base model's interaction); with
    ``D < N`` its rows are orthogonal, of squared norm ``N / D`` (dot products kept on
    average). Zero biases; the tower linear (``p``) alike."""
    torch.manual_seed(0)
    tm = DLRMTowerModule(3, N, D, c=1, p=1, init="isometric")
    for linear in (tm.feature_linear, tm.tower_linear):
        assert isinstance(linear, torch.nn.Linear)
        assert torch.count_nonzero(linear.bias) == 0
        W = linear.weight.detach().double()
        out_f, in_f = W.shape
        if out_f >= in_f:
            torch.testing.assert_close(W.T @ W, torch.eye(in_f).double(), atol=1e-5, rtol=0)
        else:
            torch.testing.assert_close(
                W @ W.T, in_f / out_f * torch.eye(out_f).double(), atol=1e-5, rtol=0
            )
    embs = torch.randn(5, 3, N)
    out = tm(embs)[:, 1:]  # the c = 1 vectors per feature, after the p = 1 tower vector
    if D >= N:
        torch.testing.assert_close(out @ out.transpose(1, 2), embs @ embs.transpose(1, 2))
    default = DLRMTowerModule(3, N, D, c=1, p=1)
    assert torch.count_nonzero(default.feature_linear.bias) > 0  # PyTorch's init otherwise


def test_tower_module_without_bias_is_linear():
    """``model.tower.bias=false``: no bias in either linear, so the tower module is linear in its
    embeddings (a zero embedding gives zero vectors; a sum of inputs gives the sum of outputs),
    the global dot interaction then has no terms linear in a single embedding."""
    torch.manual_seed(0)
    tm = DLRMTowerModule(3, 8, 4, c=1, p=1, bias=False)
    assert all(not name.endswith("bias") for name, _ in tm.named_parameters())
    assert [p.numel() for p in tm.parameters()] == [3 * 8 * 4, 8 * 4]
    a, b = torch.randn(5, 3, 8), torch.randn(5, 3, 8)
    torch.testing.assert_close(tm(a + b), tm(a) + tm(b))
    assert torch.count_nonzero(tm(torch.zeros(2, 3, 8))) == 0
    iso = DLRMTowerModule(3, 8, 8, c=1, p=0, bias=False, init="isometric")
    torch.testing.assert_close((out := iso(a)) @ out.transpose(1, 2), a @ a.transpose(1, 2))
    assert DLRMTowerModule(3, 8, 4, c=1, p=1).feature_linear.bias is not None  # on by default
    from dmt.config import DLRMTowerConfig
    from dmt.models import build_tower_module

    built = build_tower_module(DLRMTowerConfig(dim=4, bias=False), num_features=3, embedding_dim=8)
    assert isinstance(built, DLRMTowerModule) and built.feature_linear.bias is None  # the config's
