"""Disaggregated Multi-Tower models (paper §3.2, §4): towers of features, each with its own
embedding tables and tower module, then the base model's global interaction and top MLP.

Plain modules on one process; SPTT (:mod:`dmt.sptt`) distributes the same computation, reaching
``towers[t].embedding_bag_collection`` and ``towers[t].tower_module`` separately and calling
:meth:`DMTModel.interact` on the exchanged tower outputs.

Shape legend: ``B`` batch, ``F`` sparse features, ``N`` embedding dim, ``T`` towers, ``F_t``
features of tower ``t``, ``V_t`` its output vectors, ``D`` their size.

**Semantics preservation.** When every tower is :class:`PassThrough`, :meth:`DMTModel.interact`
puts the towers' vectors back in global feature order before the interaction, so the model
computes exactly what its base model (:class:`~dmt.models.DLRM`, :class:`~dmt.models.DCN`)
computes, for any grouping of the features (paper Table 3). With other tower modules the vectors
enter the interaction tower by tower, in partition order.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, cast, overload

import torch
from torch import nn
from torchrec import EmbeddingBagCollection, KeyedJaggedTensor

from dmt.models.interaction import CrossInteraction, DotInteraction, Interaction
from dmt.models.mlp import mlp
from dmt.models.partition import check_partition
from dmt.models.rec_model import RecModel, pooled_in_order
from dmt.models.tower_modules import PassThrough, TowerModule

# fx.wrap patches the name in the module that registers it: the imported name, too, must stay one
# call in an fx graph (its branch on the keys runs at run time)
torch.fx.wrap("pooled_in_order")


class Tower(nn.Module):
    """One tower: the embedding tables of its features and its tower module.

    Args:
        embedding_bag_collection: one table per feature of the tower (named ``t_<feature>``);
            its feature order is the tower's, ``feature_names``.
        tower_module: ``(B, F_t, N) -> (B, V_t, D)``.
    """

    def __init__(
        self, embedding_bag_collection: EmbeddingBagCollection, tower_module: TowerModule
    ) -> None:
        super().__init__()
        configs = embedding_bag_collection.embedding_bag_configs()
        dims = {c.embedding_dim for c in configs}
        if len(dims) != 1:
            raise ValueError(
                f"all tables of a tower must share one embedding_dim, got {sorted(dims)}"
            )
        self.embedding_dim = dims.pop()
        self.feature_names: list[str] = [f for c in configs for f in c.feature_names]
        if (tower_module.num_features, tower_module.embedding_dim) != (
            self.num_features,
            self.embedding_dim,
        ):
            raise ValueError(
                f"tower module expects {tower_module.num_features} features of dim "
                f"{tower_module.embedding_dim}, the tower has {self.num_features} of dim {self.embedding_dim}"
            )
        self.embedding_bag_collection = embedding_bag_collection
        self.tower_module = tower_module

    @property
    def num_features(self) -> int:
        return len(self.feature_names)

    def embeddings(self, features: KeyedJaggedTensor) -> torch.Tensor:
        """Pooled embeddings ``(B, F_t, N)`` in ``feature_names`` order."""
        return pooled_in_order(
            self.embedding_bag_collection(features), self.feature_names, self.embedding_dim
        )

    def forward(self, features: KeyedJaggedTensor) -> torch.Tensor:
        """``(B, V_t, D)``: the tower module over the tower's embeddings."""
        return self.tower_module(self.embeddings(features))


if TYPE_CHECKING:

    class _TowerList(nn.ModuleList):
        """``DMTModel.towers`` as mypy sees it: an ``nn.ModuleList`` whose items are towers
        (the stubs type ``nn.ModuleList`` items as plain ``nn.Module``)."""

        def __iter__(self) -> Iterator[Tower]: ...

        @overload
        def __getitem__(self, idx: slice) -> nn.ModuleList: ...

        @overload
        def __getitem__(self, idx: int) -> Tower: ...

        def __getitem__(self, idx: int | slice) -> Tower | nn.ModuleList: ...


def _output_dim(towers: Sequence[Tower]) -> int:
    dims = {t.tower_module.dim for t in towers}
    if len(dims) != 1:
        raise ValueError(
            f"tower modules output vectors of sizes {sorted(dims)}; the global interaction needs one D"
        )
    return dims.pop()


class DMTModel(nn.Module):
    """``logits = top(interaction(bottom(dense), cat_t tower_t(sparse)))``.

    Args:
        towers: the towers; together their features are ``feature_names``, each exactly once.
        num_dense: number of dense input features.
        bottom_mlp: bottom MLP layer sizes.
        interaction: maps ``(B, D0)`` and ``(B, sum_t V_t, D)`` to the top MLP's input.
        top_mlp: top MLP layer sizes (ends in 1).
        feature_names: the global sparse feature order (the base model's table order).
        bottom_final_activation: ReLU after the last bottom layer.
        dropout: dropout probability after every ReLU of the bottom and top MLPs (0: none).

    Use :func:`dmt.models.build_model` (or :class:`DMTDLRM` / :class:`DMTDCN`) to build one.
    Every tower module must output vectors of one size ``D``.

    Example::

        cfg = ModelConfig(name="dlrm", interaction=DotInteractionConfig(), embedding_dim=16,
                          bottom_mlp=[64, 8], tower=DLRMTowerConfig(dim=8, c=1, p=0))
        model = build_dmt_model(cfg, naive_partition(names, 4), feature_names=names,
                                cardinalities=rows, num_dense=13)
        outs = model.tower_outputs(kjt)       # 4 tensors (B, F_t, 8)
        logits = model.interact(dense, outs)  # (B,), == model(dense, kjt)
    """

    _partition_index: torch.Tensor
    _global_order: torch.Tensor

    def __init__(
        self,
        towers: Sequence[Tower],
        num_dense: int,
        bottom_mlp: list[int],
        interaction: Interaction,
        top_mlp: list[int],
        *,
        feature_names: Sequence[str],
        bottom_final_activation: bool = False,
        dropout: float = 0.0,
    ) -> None:
        super().__init__()
        self.feature_names: list[str] = list(feature_names)
        self.partition: list[list[str]] = [list(t.feature_names) for t in towers]
        check_partition(self.partition, self.feature_names)
        _output_dim(towers)
        dims = {t.embedding_dim for t in towers}
        if len(dims) != 1:
            raise ValueError(f"all towers' tables must share one embedding_dim, got {sorted(dims)}")
        self.embedding_dim = dims.pop()
        self.towers = cast("_TowerList", nn.ModuleList(towers))
        self.bottom = mlp(
            num_dense, list(bottom_mlp), final_activation=bottom_final_activation, dropout=dropout
        )
        self.interaction = interaction
        self.top = mlp(
            interaction.output_dim, list(top_mlp), final_activation=False, dropout=dropout
        )

        position = {f: i for i, f in enumerate(self.feature_names)}
        by_tower = torch.tensor([position[f] for tower in self.partition for f in tower])
        self._tower_sizes = [len(tower) for tower in self.partition]
        self._flat_partition = [f for tower in self.partition for f in tower]
        # Global feature index of every tower input, towers concatenated (splits (B, F, N) by tower).
        self.register_buffer("_partition_index", by_tower, persistent=False)
        passthrough = all(isinstance(t.tower_module, PassThrough) for t in towers)
        self._reorder = passthrough and self._flat_partition != self.feature_names
        # Position in the towers' concatenated outputs of every global feature (pass-through only).
        self.register_buffer("_global_order", torch.argsort(by_tower), persistent=False)

    @property
    def num_features(self) -> int:
        return len(self.feature_names)

    @property
    def num_towers(self) -> int:
        return len(self.towers)

    @property
    def tower_output_dims(self) -> list[tuple[int, int]]:
        """``(V_t, D)`` of every tower's output."""
        return [(t.tower_module.num_vectors, t.tower_module.dim) for t in self.towers]

    def split_features(self, sparse_features: KeyedJaggedTensor) -> list[KeyedJaggedTensor]:
        keys = sparse_features.keys()
        if keys != self._flat_partition:
            missing = [f for f in self._flat_partition if f not in keys]
            if missing:
                raise ValueError(f"sparse features lack the model's features {missing}")
            sparse_features = sparse_features.permute([keys.index(f) for f in self._flat_partition])
        return sparse_features.split(self._tower_sizes)

    def tower_embeddings(self, sparse_features: KeyedJaggedTensor) -> list[torch.Tensor]:
        """Every tower's pooled embeddings, ``T`` tensors ``(B, F_t, N)``."""
        return [
            t.embeddings(kjt) for t, kjt in zip(self.towers, self.split_features(sparse_features))
        ]

    def tower_outputs(self, sparse_features: KeyedJaggedTensor) -> list[torch.Tensor]:
        """Every tower's module output, ``T`` tensors ``(B, V_t, D)``."""
        return [t(kjt) for t, kjt in zip(self.towers, self.split_features(sparse_features))]

    def interact(
        self, dense_features: torch.Tensor, tower_outputs: Sequence[torch.Tensor]
    ) -> torch.Tensor:
        """Bottom MLP, global interaction and top MLP over the towers' outputs -> logits ``(B,)``.

        The bottom MLP runs before ``tower_outputs`` is touched: a distributed caller may pass
        outputs still in flight (SPTT's step f) and have them waited for only here."""
        bottom = self.bottom(dense_features)
        if len(tower_outputs) != self.num_towers:
            raise ValueError(f"got {len(tower_outputs)} tower outputs for {self.num_towers} towers")
        vectors = torch.cat(list(tower_outputs), dim=1) if self.num_towers > 1 else tower_outputs[0]
        if self._reorder:
            vectors = vectors.index_select(1, self._global_order)
        return self.top(self.interaction(bottom, vectors)).squeeze(-1)

    def dense_forward(self, dense_features: torch.Tensor, pooled: torch.Tensor) -> torch.Tensor:
        """Everything after the lookup, from the pooled embeddings ``(B, F, N)`` in global feature
        order: tower modules, then :meth:`interact` (what accounting counts)."""
        inputs = pooled.index_select(1, self._partition_index).split(self._tower_sizes, dim=1)
        return self.interact(
            dense_features, [t.tower_module(x) for t, x in zip(self.towers, inputs)]
        )

    def forward(
        self, dense_features: torch.Tensor, sparse_features: KeyedJaggedTensor
    ) -> torch.Tensor:
        return self.interact(dense_features, self.tower_outputs(sparse_features))


class DMTDLRM(DMTModel):
    """DMT-DLRM: pairwise dot interaction over the bottom output and all towers' ``D``-sized vectors.

    The bottom MLP's last size must be ``D`` (``N`` with pass-through towers), as DLRM's must be
    ``N``: the dense vector joins the dot products, and ending the bottom MLP at ``D`` adds no layer
    (it is also what the paper's Table 5 FLOPs scale with).
    """

    def __init__(
        self,
        towers: Sequence[Tower],
        num_dense: int,
        bottom_mlp: list[int],
        top_mlp: list[int],
        *,
        feature_names: Sequence[str],
        bottom_final_activation: bool = False,
        dropout: float = 0.0,
    ) -> None:
        num_vectors = sum(t.tower_module.num_vectors for t in towers)
        super().__init__(
            towers,
            num_dense,
            bottom_mlp,
            DotInteraction(num_vectors, _output_dim(towers), bottom_mlp[-1]),
            top_mlp,
            feature_names=feature_names,
            bottom_final_activation=bottom_final_activation,
            dropout=dropout,
        )


class DMTDCN(DMTModel):
    """DMT-DCN: DCN's low-rank CrossNet over ``cat([bottom(dense), flatten(tower outputs)])``,
    of width ``bottom_mlp[-1] + sum_t O_t``."""

    def __init__(
        self,
        towers: Sequence[Tower],
        num_dense: int,
        bottom_mlp: list[int],
        top_mlp: list[int],
        *,
        feature_names: Sequence[str],
        num_cross_layers: int = 3,
        low_rank: int = 64,
        bottom_final_activation: bool = False,
        dropout: float = 0.0,
    ) -> None:
        interaction = CrossInteraction(
            sum(t.tower_module.num_vectors for t in towers),
            _output_dim(towers),
            bottom_mlp[-1],
            num_layers=num_cross_layers,
            low_rank=low_rank,
        )
        super().__init__(
            towers,
            num_dense,
            bottom_mlp,
            interaction,
            top_mlp,
            feature_names=feature_names,
            bottom_final_activation=bottom_final_activation,
            dropout=dropout,
        )


@torch.no_grad()
def copy_base_weights(model: DMTModel, base: RecModel, *, dense: bool = True) -> None:
    """Copy ``base``'s embedding tables (by table name) and, if ``dense``, its bottom MLP,
    interaction and top MLP into ``model``.

    With pass-through towers the DMT model then computes exactly what ``base`` computes. Other
    tower modules change the dense shapes: copy the tables only (``dense=False``).
    """
    if sorted(model.feature_names) != sorted(base.feature_names):
        raise ValueError(
            f"the models have different sparse features: {model.feature_names} vs {base.feature_names}"
        )
    tables = base.embedding_bag_collection.state_dict()
    for tower in model.towers:
        ebc = tower.embedding_bag_collection
        ebc.load_state_dict({k: tables[k] for k in ebc.state_dict()})
    if not dense:
        return
    for name in ("bottom", "interaction", "top"):
        try:
            getattr(model, name).load_state_dict(getattr(base, name).state_dict())
        except RuntimeError as e:
            raise ValueError(
                f"cannot copy the base model's {name} (only pass-through towers keep the base "
                f"model's dense shapes; use dense=False to copy the tables alone): {e}"
            ) from e
