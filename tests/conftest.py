"""Shared test helpers: Hydra composition and the optional ../shared data."""

from __future__ import annotations

from pathlib import Path

import pytest

__all__ = ["compose_config", "typed_config"]
from dmt.train import compose_config, to_config

REPO = Path(__file__).resolve().parents[1]
SHARED_DATA = REPO.parent / "shared" / "data"


def typed_config(*overrides: str):
    return to_config(compose_config(*overrides))


@pytest.fixture
def shared_data() -> Path:
    if not SHARED_DATA.is_dir():
        pytest.skip(f"{SHARED_DATA} is absent (Criteo samples are not distributed with dmt)")
    return SHARED_DATA


@pytest.fixture
def one_thread():
    """Tiny models: intra-op threads only contend with each other (and with other jobs)."""
    import torch  # noqa: PLC0415

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)
