"""``dmt-export``: a training checkpoint as one plain ``torch.save`` state dict.

Examples::

    dmt-export --checkpoint outputs/<date>/<time>/checkpoints --out model.pt
    dmt-export --checkpoint runs/sptt/checkpoints/step_4000 --out dmt_8t.pt

The checkpoint (DCP, any world size, flat or SPTT) is read in this one process
(:func:`dmt.checkpoint.load_model_state`) and written as the *plain* model's state dict (the keys
of ``dmt.models.build_model(...)``'s ``state_dict()``, whole tables), for serving or other tools::

    model = build_model(cfg.model, ...); model.load_state_dict(torch.load("model.pt"))

The run's ``config.yaml`` is copied beside it (``model.pt.config.yaml``), before the model. An
existing output is never replaced, even one that appears while the checkpoint loads, and nothing
half-written is left (each file is written to a temporary file, fsynced and linked into place).
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import BinaryIO

import torch

from dmt import checkpoint


def export(checkpoint_path: str | os.PathLike[str], out: str | os.PathLike[str]) -> Path:
    """Write the plain model state of checkpoint ``checkpoint_path`` to ``out``; returns it.

    Raises:
        ValueError: the checkpoint is missing or damaged, or ``out`` (or its config sidecar)
            exists already.
    """
    out = Path(out)
    sidecar = out.with_name(out.name + ".config.yaml")
    for path in (out, sidecar):
        if path.exists():
            raise ValueError(f"{path} exists already; dmt-export never replaces a file")
    step_dir = checkpoint.resolve(Path(checkpoint_path), setting="--checkpoint")
    state = {
        key.removeprefix("model."): tensor
        for key, tensor in checkpoint.load_model_state(step_dir).items()
    }
    out.parent.mkdir(parents=True, exist_ok=True)
    config = step_dir / checkpoint.CONFIG_FILE
    published = False
    if config.is_file():  # the sidecar first: a model file never stands without its config
        _publish(sidecar, lambda f: f.write(config.read_bytes()))
        published = True
    try:
        _publish(out, lambda f: torch.save(state, f))
    except BaseException:
        if published:  # not a sidecar without its model: a retry would be refused for it
            sidecar.unlink(missing_ok=True)
        raise
    return out


def _publish(path: Path, write: Callable[[BinaryIO], object]) -> None:
    """Write ``path`` whole or not at all, never over a file: into a temporary file of its own
    beside it, fsynced, then linked to ``path`` (which fails if ``path`` appeared meanwhile, e.g.
    from a concurrent export); the temporary file is removed in every case."""
    fd, name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    tmp = Path(name)
    try:
        # mkstemp's file is the owner's only (0600); an export is read by others (serving, a
        # shared file system): the mode a new file gets under the umask, as open() gives
        umask = os.umask(0)
        os.umask(umask)
        os.fchmod(fd, 0o666 & ~umask)
        with os.fdopen(fd, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        try:
            os.link(tmp, path)
        except FileExistsError:
            raise ValueError(f"{path} exists already; dmt-export never replaces a file") from None
        dir_fd = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)
    finally:
        tmp.unlink(missing_ok=True)


def main(argv: Sequence[str] | None = None) -> int:
    """Run ``dmt-export``; returns the exit status (0 success, 1 bad input, 2 bad usage)."""
    p = argparse.ArgumentParser(
        prog="dmt-export", description="Write a dmt checkpoint as one plain torch.save state dict."
    )
    p.add_argument(
        "--checkpoint",
        required=True,
        help="<run>/checkpoints (newest complete step) or <run>/checkpoints/step_N",
    )
    p.add_argument("--out", required=True, help="output .pt file (never replaced)")
    args = p.parse_args(argv)
    try:
        path = export(args.checkpoint, args.out)
    except (ValueError, OSError) as e:  # OSError: e.g. no space left for the output
        print(f"dmt-export: error: {e}", file=sys.stderr)
        return 1
    print(f"written to {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
