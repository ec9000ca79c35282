"""Tower modules (paper §4, Listings 1-2): the dense module each tower applies to its features.

A tower module maps the pooled embeddings of its tower's ``F_t`` features, ``(B, F_t, N)``, to
``V_t`` vectors of size ``D``, ``(B, V_t, D)``. Its *output size* ``O_t = V_t D`` is what leaves
the tower (SPTT step f), so ``sum_t O_t`` against ``|F| N`` is the compression ratio of the
cross-host traffic (:func:`dmt.models.accounting.compression_ratio`).

Shape legend: ``B`` batch, ``F_t`` features of the tower, ``N`` embedding dim, ``V_t`` output
vectors, ``D`` their size.
"""

from __future__ import annotations

import math

import torch
from torch import nn
from torchrec.modules.crossnet import LowRankCrossNet


def _check_positive(module: str, **values: int) -> None:
    for name, value in values.items():
        if not isinstance(value, int) or value <= 0:
            raise ValueError(f"{module}: {name}={value!r} must be a positive integer")


def _check_vectors(module: str, c: int, p: int) -> None:
    if not (isinstance(c, int) and isinstance(p, int)) or c < 0 or p < 0 or c + p == 0:
        raise ValueError(
            f"{module}: c={c!r} and p={p!r} must be integers >= 0 with c + p >= 1 "
            "(c vectors per feature plus p per tower)"
        )


PROJECTION_INITS = ("default", "isometric")


def _projection(
    in_features: int,
    out_features: int,
    skip_square: bool,
    init: str = "default",
    bias: bool = True,
) -> nn.Module:
    """``Linear(in -> out, bias=bias)``, or the identity when ``skip_square`` and the sizes are
    equal.

    ``init``: ``"default"`` is PyTorch's ``Linear`` init; ``"isometric"`` an orthogonal weight
    scaled by ``sqrt(max(1, in / out))`` and a zero bias, so the projection keeps the dot
    products of its inputs on average (exactly when ``out >= in``: ``W^T W = I``; when it
    compresses, ``W W^T = (in / out) I``), and a tower module starts from pooled embeddings
    whose dot interaction is the base model's."""
    if init not in PROJECTION_INITS:
        raise ValueError(
            f"model.tower.init={init!r}: expected one of {', '.join(PROJECTION_INITS)}"
        )
    if skip_square and in_features == out_features:
        return nn.Identity()
    linear = nn.Linear(in_features, out_features, bias=bias)
    if init == "isometric":
        nn.init.orthogonal_(linear.weight, gain=math.sqrt(max(1.0, in_features / out_features)))
        if linear.bias is not None:
            nn.init.zeros_(linear.bias)
    return linear


class TowerModule(nn.Module):
    """Base class: ``forward(embs (B, F_t, N)) -> (B, V_t, D)``.

    Attributes:
        num_features: ``F_t``, the tower's features.
        embedding_dim: ``N``, their embedding dim.
        num_vectors: ``V_t``, output vectors per sample.
        dim: ``D``, the size of each output vector.
    """

    num_features: int
    embedding_dim: int
    num_vectors: int
    dim: int

    @property
    def output_size(self) -> int:
        """``O_t = V_t D``: values per sample that leave the tower."""
        return self.num_vectors * self.dim

    def _check_input(self, embs: torch.Tensor) -> None:
        if embs.dim() != 3 or embs.shape[1:] != (self.num_features, self.embedding_dim):
            raise ValueError(
                f"{type(self).__name__} expects (B, {self.num_features}, {self.embedding_dim}) "
                f"embeddings, got {tuple(embs.shape)}"
            )


class PassThrough(TowerModule):
    """Identity: SPTT alone (paper §5.2.1, Table 3). ``V_t = F_t``, ``D = N``."""

    def __init__(self, num_features: int, embedding_dim: int) -> None:
        super().__init__()
        _check_positive("PassThrough", num_features=num_features, embedding_dim=embedding_dim)
        self.num_features = self.num_vectors = num_features
        self.embedding_dim = self.dim = embedding_dim

    def forward(self, embs: torch.Tensor) -> torch.Tensor:
        self._check_input(embs)
        return embs


class DLRMTowerModule(TowerModule):
    """Listing 1: ``cat([Linear(F_t N -> p D)(flatten(embs)), Linear(N -> c D)(embs)])``.

    ``p`` vectors mix all the tower's features (a linear combination, like DLRM's over arch);
    ``c`` vectors per feature project each embedding on its own. Output
    ``(B, p + c F_t, D)``: the ``p`` tower vectors first, then feature by feature its ``c``
    vectors. ``O_t = D (c F_t + p)``.

    Args:
        num_features: ``F_t``.
        embedding_dim: ``N``.
        dim: ``D``.
        c: output vectors per feature (``>= 0``).
        p: output vectors per tower (``>= 0``); ``c + p >= 1``.
        skip_square: leave out a linear whose output is as large as its input (``N = c D``,
            or ``F_t N = p D`` in a one-feature tower), e.g. ``Linear(N -> N)`` of a one-feature
            tower with ``p=1, D=N``: after a table it only reparametrizes the table (over
            several features the tower linear mixes them, and stays). The paper's 16-tower rows of
            Table 4 count no such layer (``conf/experiment/paper_dmt_16t_*.yaml``).
        init: ``"default"`` (PyTorch's) or ``"isometric"`` (orthogonal, dot products kept
            on average; see :func:`_projection`) for both linears.
        bias: whether the linears have a bias (one shared by the tower's features: it adds
            terms linear in each embedding to the global dot interaction).

    Example::

        tm = DLRMTowerModule(num_features=4, embedding_dim=128, dim=64, c=1, p=0)
        tm(torch.randn(32, 4, 128)).shape  # (32, 4, 64); tm.output_size == 256
    """

    def __init__(
        self,
        num_features: int,
        embedding_dim: int,
        dim: int,
        *,
        c: int,
        p: int,
        skip_square: bool = False,
        init: str = "default",
        bias: bool = True,
    ) -> None:
        super().__init__()
        _check_positive(
            "DLRMTowerModule", num_features=num_features, embedding_dim=embedding_dim, dim=dim
        )
        _check_vectors("DLRMTowerModule", c, p)
        self.num_features, self.embedding_dim, self.dim = num_features, embedding_dim, dim
        self.c, self.p = c, p
        self.num_vectors = p + c * num_features
        # Absent rather than zero-width when c or p is 0, so no empty layer shows up in accounting.
        width = num_features * embedding_dim
        # a square tower linear is a mere reparametrization of the table only over one feature;
        # over several it mixes them, and leaving it out would change the model
        self.tower_linear = (
            _projection(width, p * dim, skip_square and num_features == 1, init, bias)
            if p
            else None
        )
        self.feature_linear = (
            _projection(embedding_dim, c * dim, skip_square, init, bias) if c else None
        )

    def forward(self, embs: torch.Tensor) -> torch.Tensor:
        self._check_input(embs)
        B = embs.size(0)
        parts = []
        if self.tower_linear is not None:
            parts.append(self.tower_linear(embs.flatten(1)).view(B, self.p, self.dim))
        if self.feature_linear is not None:
            parts.append(self.feature_linear(embs).view(B, self.c * self.num_features, self.dim))
        return parts[0] if len(parts) == 1 else torch.cat(parts, dim=1)


class DCNTowerModule(TowerModule):
    """Listing 2: a small CrossNet over the tower's ``F_t N`` flattened embeddings, then
    ``Linear(F_t N -> (c F_t + p) D)``, viewed ``(B, c F_t + p, D)``. ``O_t = D (c F_t + p)``.

    Listing 2 as printed is ``c=1, p=0`` (``O_t = F_t D``). ``c=0, p=1`` sends one ``D``-vector
    per tower (as Listing 1 does with ``p=1``); it is the reading that reproduces the paper's
    Table 4 DMT-DCN FLOPs (``conf/experiment/paper_dmt_*t_dcn.yaml``).

    The CrossNet is TorchRec's ``LowRankCrossNet`` (``x_{l+1} = x_0 * (W_l (V_l x_l) + b_l) + x_l``),
    the same operator as DCN's global interaction, as the paper builds tower modules from the
    model's own interaction operators. A rank of at least ``F_t N`` is as expressive as the
    full-rank CrossNet.

    Args:
        num_features: ``F_t``.
        embedding_dim: ``N``.
        dim: ``D``.
        dcn_num_layers: cross layers of the tower's CrossNet.
        dcn_low_rank: rank of each cross layer.
        c: output vectors per feature (``>= 0``).
        p: output vectors per tower (``>= 0``); ``c + p >= 1``.
        skip_square: leave out the projection of a one-feature tower when ``N = O_t`` (as
            the paper's 16T row does; see :class:`DLRMTowerModule`). Over several features a
            square projection mixes them and stays.
    """

    def __init__(
        self,
        num_features: int,
        embedding_dim: int,
        dim: int,
        *,
        dcn_num_layers: int,
        dcn_low_rank: int,
        c: int = 1,
        p: int = 0,
        skip_square: bool = False,
    ) -> None:
        super().__init__()
        _check_positive(
            "DCNTowerModule",
            num_features=num_features,
            embedding_dim=embedding_dim,
            dim=dim,
            dcn_num_layers=dcn_num_layers,
            dcn_low_rank=dcn_low_rank,
        )
        _check_vectors("DCNTowerModule", c, p)
        self.num_features, self.embedding_dim, self.dim = num_features, embedding_dim, dim
        self.c, self.p = c, p
        self.num_vectors = c * num_features + p
        width = num_features * embedding_dim
        self.crossnet = LowRankCrossNet(
            in_features=width, num_layers=dcn_num_layers, low_rank=dcn_low_rank
        )
        # as DLRMTowerModule's tower linear: left out over one feature only (over several, e.g.
        # Listing 2's c=1, p=0 with D = N, it mixes them, and leaving it out changes the model)
        self.projection = _projection(
            width, self.num_vectors * dim, skip_square and num_features == 1
        )

    def forward(self, embs: torch.Tensor) -> torch.Tensor:
        self._check_input(embs)
        out = self.projection(self.crossnet(embs.flatten(1)))
        return out.view(embs.size(0), self.num_vectors, self.dim)
