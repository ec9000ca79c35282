"""Criteo data on several ranks (dmt/data/criteo_dataset.py ``build_criteo``): rank 0 alone
preprocesses ``data.criteo.raw_path`` and transforms ``data.criteo.test_path``; the others wait
for it through the process group's store, however much longer than the group's timeout it takes.

Each worker replaces its default group by one with a 2-second timeout (:data:`SHORT_TIMEOUT`) and
wraps dmt's own preprocessing functions (inside the worker processes only) with ones that record
each call and, on rank 0, sleep :data:`SLOW_S` first, then call the real functions.
"""

from __future__ import annotations

import functools
import re
import time
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist

import dmt.data.criteo_dataset as criteo_dataset
from dmt.config import DataConfig
from dmt.data.criteo_config import CriteoConfig
from tests.distributed.distributed_harness import run_on_ranks
from tests.unit.test_criteo_dataset import _raw_rows

SHORT_TIMEOUT = timedelta(seconds=2)
SLOW_S = 3.5  # rank 0's preprocessing takes longer than SHORT_TIMEOUT


def _short_timeout_group(rank: int, world_size: int, init_file: str) -> None:
    """Replace the harness's default group (30 s timeout) by one with :data:`SHORT_TIMEOUT`."""
    dist.destroy_process_group()
    dist.init_process_group(
        "gloo",
        init_method=f"file://{init_file}",
        rank=rank,
        world_size=world_size,
        timeout=SHORT_TIMEOUT,
    )


def _slow_and_logged(fn: Callable[..., Path], log_dir: Path, name: str) -> Callable[..., Path]:
    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Path:
        rank = dist.get_rank()
        (log_dir / f"{name}-rank{rank}-{len(list(log_dir.iterdir()))}").touch()
        if rank == 0:
            time.sleep(SLOW_S)
        return fn(*args, **kwargs)

    return wrapper


def _build(rank: int, world_size: int, init_file: str, cfgs: list[DataConfig], log_dir: str) -> Any:
    """``build_criteo`` for each of ``cfgs`` in turn (in this one process): its test directory and
    share of the test labels, or the message of the ValueError it raised."""
    _short_timeout_group(rank, world_size, init_file)
    calls = Path(log_dir)
    out: list[Any] = []
    with pytest.MonkeyPatch.context() as mp:
        for name in ("preprocess_criteo", "transform_tsv"):  # on every rank: calls are logged
            real = getattr(criteo_dataset, name)
            mp.setattr(criteo_dataset, name, _slow_and_logged(real, calls, name))
        for cfg in cfgs:
            try:
                bundle = criteo_dataset.build_criteo(cfg, rank=rank, world_size=world_size)
            except ValueError as exc:
                out.append(("error", str(exc)))
                continue
            labels = torch.cat([b.labels for b in bundle.test.batches(0)]).tolist()
            out.append((bundle.info["test_dir"], labels))
    dist.barrier()  # a collective still works after the long wait
    return out


def _config(tmp_path: Path, raw: str = "train.txt", **kw: Any) -> DataConfig:
    crit = CriteoConfig(
        raw_path=str(tmp_path / raw),
        preprocessed_dir=str(tmp_path / "prep"),
        num_workers=1,
        **kw,
    )
    return DataConfig(kind="criteo", batch_size=32, eval_batch_size=50, criteo=crit)


# CI time (2 cores): a preprocessing longer than the group's timeout (11 s) runs with -m slow
@pytest.mark.slow
def test_rank_zero_preprocesses_longer_than_the_group_timeout_once(tmp_path: Path) -> None:
    (tmp_path / "train.txt").write_text(_raw_rows(200, seed=1))
    extra = tmp_path / "extra.tsv"
    extra.write_text(_raw_rows(37, seed=2))
    log_dir = tmp_path / "calls"
    log_dir.mkdir()
    cfgs = [
        _config(tmp_path, test_path=str(extra)),
        # the same directory with other settings, in the same process: rank 0's error must
        # reach rank 1 (not the first call's answer)
        _config(tmp_path, test_path=str(extra), frequency_threshold=5),
    ]
    results = run_on_ranks(
        _build, 2, str(tmp_path / "rendezvous"), cfgs, str(log_dir), timeout_s=180.0
    )
    (test_dir, labels_0), (kind, message) = results[0]
    (test_dir_1, labels_1), second_1 = results[1]
    assert test_dir_1 == test_dir and second_1 == (kind, message)  # the same on both ranks
    assert Path(test_dir).parent.parent == tmp_path and Path(test_dir).name == "test"
    # one evaluation batch of 37 rows: rank 0 holds its first 19, rank 1 the other 18
    want = [float(line.split("\t")[0]) for line in extra.read_text().splitlines()]
    assert (len(labels_0), labels_0 + labels_1) == (19, want)
    assert kind == "error" and "was made with other settings or sources" in message
    assert message.startswith("preprocessing data.criteo.raw_path=")
    # each function ran on rank 0 only, once per call (the failed second call stops before
    # the test file); one transformed directory beside the preprocessed one
    assert sorted(p.name.rsplit("-", 1)[0] for p in log_dir.iterdir()) == [
        "preprocess_criteo-rank0",
        "preprocess_criteo-rank0",
        "transform_tsv-rank0",
    ]
    assert [p.name for p in tmp_path.glob("prep.*")] == [Path(test_dir).parent.name]
    assert not list(tmp_path.glob(".prep*"))  # no partial or old directory left


# CI time (2 cores): the missing test file (8 s; the same exchange as the raw file's) runs with -m slow
@pytest.mark.parametrize("missing", ["raw_path", pytest.param("test_path", marks=pytest.mark.slow)])
def test_a_rank_zero_failure_reaches_every_rank(tmp_path: Path, missing: str) -> None:
    (tmp_path / "train.txt").write_text(_raw_rows(200, seed=3))
    log_dir = tmp_path / "calls"
    log_dir.mkdir()
    if missing == "raw_path":
        cfg = _config(tmp_path, raw="missing.txt")
        want = r"^preprocessing data\.criteo\.raw_path=.*missing\.txt' is neither a file nor a dir"
    else:
        cfg = _config(tmp_path, test_path=str(tmp_path / "missing.tsv"))
        want = r"missing\.tsv"
    results = run_on_ranks(_build, 2, str(tmp_path / "rendezvous"), [cfg], str(log_dir))
    assert results[0] == results[1]
    [(kind, message)] = results[0]
    assert kind == "error"
    assert re.search(want, message), message
    assert all(p.name.split("-")[1] == "rank0" for p in log_dir.iterdir())
