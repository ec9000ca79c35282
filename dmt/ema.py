"""An exponential moving average (EMA) of the dense weights, evaluated in their place
(``trainer.ema_decay``).

After every optimizer step ``avg <- decay * avg + (1 - decay) * w``, the first step copying
``w`` (torch's ``get_ema_multi_avg_fn``, the update ``AveragedModel`` applies). Evaluation runs
with the averages swapped into the parameters (:meth:`DenseEMA.applied`); training goes on from
the raw weights.

Only the dense part is averaged: the bottom and top MLPs, the interaction and the DMT tower
modules, which every rank (or every rank of a tower) holds whole. The embedding tables stay raw:
they are sharded and updated inside FBGEMM's fused backward, and an average of them would
double their memory and cost a pass over every row at every step, though a step touches only
the rows of its batch. ``AveragedModel`` itself deep-copies the module, tables and process
groups included, so it is not used on the sharded model.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from typing import Any

import torch
from torch import nn
from torch.optim.swa_utils import get_ema_multi_avg_fn


class DenseEMA:
    """EMA of ``named_params`` (name, parameter), updated by :meth:`update` after each step.

    Args:
        named_params: the parameters to average (those the dense optimizer updates), local
            tensors on this rank.
        decay: weight of the old average, in ``[0, 1)``.

    Example::

        ema = DenseEMA(model.named_parameters(), decay=0.999)
        for batch in batches:
            train_step(batch)
            ema.update()
        with ema.applied():
            evaluate(model)  # on the averages; the raw weights are back afterwards
    """

    def __init__(self, named_params: Iterable[tuple[str, nn.Parameter]], decay: float) -> None:
        if not 0.0 <= decay < 1.0:
            raise ValueError(
                f"trainer.ema_decay={decay!r} must be in [0, 1) (the weight of the old average, "
                "e.g. 0.999), or null to evaluate the raw weights"
            )
        named = list(named_params)
        self.decay = decay
        self.names = [name for name, _ in named]
        self.params = [p for _, p in named]
        self.averages = [p.detach().clone() for p in self.params]
        self.num_updates = 0
        self._average = get_ema_multi_avg_fn(decay)

    @torch.no_grad()
    def update(self) -> None:
        """Fold the parameters' current values into the averages (call after each step)."""
        if not self.params:
            return
        if self.num_updates == 0:
            torch._foreach_copy_(self.averages, [p.detach() for p in self.params])
        else:
            self._average(self.averages, [p.detach() for p in self.params], self.num_updates)
        self.num_updates += 1

    @contextmanager
    def applied(self) -> Iterator[None]:
        """The averages in the parameters' place inside the block (copied in, the raw values
        copied back after; gradients and optimizer state untouched). Before the first update
        the parameters are left as they are."""
        if self.num_updates == 0:
            yield
            return
        with torch.no_grad():
            raw = [p.detach().clone() for p in self.params]
            torch._foreach_copy_([p.detach() for p in self.params], self.averages)
        try:
            yield
        finally:
            with torch.no_grad():
                torch._foreach_copy_([p.detach() for p in self.params], raw)

    def state_dict(self) -> dict[str, Any]:
        return {"num_updates": self.num_updates, "averages": dict(zip(self.names, self.averages))}

    @torch.no_grad()
    def load_state_dict(self, state: dict[str, Any]) -> None:
        averages = state["averages"]
        if sorted(averages) != sorted(self.names):
            raise ValueError(
                f"EMA state of {len(averages)} parameters does not fit these {len(self.names)} "
                f"(e.g. {sorted(set(averages) ^ set(self.names))[:3]})"
            )
        torch._foreach_copy_(self.averages, [averages[n] for n in self.names])
        self.num_updates = int(state["num_updates"])
