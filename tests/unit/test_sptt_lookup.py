"""Step b's lookup (dmt.sptt.dataflow._FusedShards): its direct call of the one FBGEMM kernel
gives TorchRec's FusedEmbeddingBagCollection's values, gradients and fused updates, without
processes (``torch.equal``)."""

from __future__ import annotations

import pytest
import torch
from torchrec.modules.embedding_configs import EmbeddingBagConfig, PoolingType
from torchrec.optim import RowWiseAdagrad
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

from dmt.sptt.dataflow import _FusedShards


def _tables(poolings: list[PoolingType]) -> list[EmbeddingBagConfig]:
    return [
        EmbeddingBagConfig(
            num_embeddings=7 + i, embedding_dim=4, name=f"t{i}", feature_names=[f"f{i}"], pooling=p
        )
        for i, p in enumerate(poolings)
    ]


def _batch(keys: list[str], seed: int) -> KeyedJaggedTensor:
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(0, 4, (len(keys) * 5,), generator=g)  # 5 samples, 0-3 ids per bag
    values = torch.randint(0, 7, (int(lengths.sum()),), generator=g)
    return KeyedJaggedTensor(keys=keys, values=values, lengths=lengths)


def _pooled_by_hand(
    shards: _FusedShards, features: KeyedJaggedTensor, poolings: list[PoolingType]
) -> torch.Tensor:
    weights = dict(shards.named_parameters())
    bags = features.to_dict()
    return torch.cat(
        [
            torch.nn.functional.embedding_bag(
                bags[f"f{i}"].values(),
                weights[f"fused.embedding_bags.t{i}.weight"].detach(),
                bags[f"f{i}"].offsets()[:-1],
                mode="sum" if p == PoolingType.SUM else "mean",
            )
            for i, p in enumerate(poolings)
        ],
        dim=1,
    )


DEVICES = [
    "cpu",
    pytest.param(
        "cuda",
        marks=pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU"),
    ),
]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize(
    "poolings, direct",
    [
        ([PoolingType.SUM] * 3, True),
        ([PoolingType.MEAN, PoolingType.MEAN], True),
        ([PoolingType.SUM, PoolingType.MEAN, PoolingType.SUM], False),  # two kernels
    ],
)
def test_direct_lookup_equals_fused_embedding_bag_collection(
    poolings: list[PoolingType], direct: bool, device: str
) -> None:
    def build() -> _FusedShards:
        # not deepcopy: the copy's parameters would no longer be views of its kernel's weights
        torch.manual_seed(0)
        return _FusedShards(_tables(poolings), (RowWiseAdagrad, {"lr": 0.1}), torch.device(device))

    shards, reference = build(), build()
    for w, e in zip(shards.parameters(), reference.parameters(), strict=True):
        assert torch.equal(w, e)
    keys = [f"f{i}" for i in range(len(poolings))]
    assert (shards._direct_keys == keys) is direct
    reference._direct_keys = None  # TorchRec's forward
    initial = [w.detach().clone() for w in shards.parameters()]
    for step in range(3):  # the fused optimizer updates the rows in each backward
        features = _batch(keys, step).to(torch.device(device))
        out, expected = shards(features), reference(features)
        assert torch.equal(out, expected)
        # and both are the tables' bags pooled by hand, in table order (TorchRec's forward
        # concatenates its pooling groups' kernels in another order with mixed pooling)
        torch.testing.assert_close(out, _pooled_by_hand(shards, features, poolings))
        grad = torch.randn_like(out)
        out.backward(grad)
        expected.backward(grad)
        for (name, w), (_, e) in zip(
            shards.named_parameters(), reference.named_parameters(), strict=True
        ):
            assert torch.equal(w, e), name
    assert not any(torch.equal(w, i) for w, i in zip(shards.parameters(), initial))  # trained
    # another key order than the kernel's: TorchRec's forward, which selects by name
    swapped = KeyedJaggedTensor.from_jt_dict(
        {k: _batch(keys, 9).to_dict()[k] for k in reversed(keys)}
    ).to(torch.device(device))
    assert torch.equal(shards(swapped), reference(swapped))
