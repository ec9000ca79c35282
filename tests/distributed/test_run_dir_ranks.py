"""Run directories across ranks (dmt/run_dir.py): one directory per job, one verdict for all ranks."""

from __future__ import annotations

from pathlib import Path

from dmt.run_dir import HYDRA_FILES, agree_on_run_dir, claim_run_dir
from tests.distributed.distributed_harness import run_on_ranks


def _agree_worker(rank: int, world_size: int, root: str) -> tuple[str, str | None]:
    own = Path(root) / f"rank{rank}"  # as if each rank's clock had named its own directory
    for name in HYDRA_FILES:
        (own / name).parent.mkdir(parents=True, exist_ok=True)
        (own / name).write_text("hydra\n")
    run_dir = agree_on_run_dir(own, rank=rank, world_size=world_size, from_hydra=True)
    ranks = {"rank": rank, "world_size": world_size}
    try:
        with claim_run_dir(run_dir, resume_from=None, checkpoint_dir="checkpoints", **ranks):
            if rank == 0:
                (run_dir / "metrics.json").write_text("{}")
        with claim_run_dir(run_dir, resume_from=None, checkpoint_dir="checkpoints", **ranks):
            return str(run_dir), None
    except ValueError as e:
        return str(run_dir), str(e)


def test_ranks_take_rank_0s_directory_and_share_its_verdict(tmp_path) -> None:
    results = run_on_ranks(_agree_worker, 2, str(tmp_path), timeout_s=60)
    rank0 = str(tmp_path / "rank0")
    assert [r[0] for r in results] == [rank0, rank0]
    assert not (tmp_path / "rank1").exists()  # rank 1's stray Hydra directory is gone
    assert results[0][1] == results[1][1] and results[1][1].startswith(
        f"run directory {rank0} already holds another run's outputs (metrics.json)"
    )
