"""``dmt-export``: a training checkpoint as one plain ``torch.save`` state dict.

Examples::

    dmt-export --checkpoint outputs/<date>/<time>/checkpoints --out model.pt
    dmt-export --checkpoint runs/sptt/checkpoints/step_4000 --out dmt_8t.pt

The checkpoint (DCP, any world size, flat or SPTT) is read in this one process
(:func:`dmt.checkpoint.load_model_state`) and written as the *plain* model's state dict (the keys
of ``dmt.models.build_model(...)``'s ``state_dict()``, whole tables), for serving or other tools::

    model = build_model(cfg.model, ...); model.load_state_dict(torch.load("model.pt"))

The checkpoint's ``config.yaml`` is copied beside it (``model.pt.config.yaml``); a checkpoint
without one is refused, and so is one whose ``config.yaml`` does not build a model its weights
fit (hand-edited, say), as ``dmt-eval`` refuses it (:func:`dmt.evaluate.load_model`). An
existing output is never replaced, even one that appears while the checkpoint loads, and nothing
half-written is left: each file is written to a temporary file and fsynced, both before either
is linked into place (the config first), and ``SIGTERM`` (``kill``, ``timeout``, a
scheduler's) removes the temporary files as an error does.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import tempfile
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import BinaryIO

import torch

from dmt import checkpoint
from dmt.evaluate import find_checkpoint, load_model, open_checkpoint


def export(checkpoint_path: str | os.PathLike[str], out: str | os.PathLike[str]) -> Path:
    """Write the plain model state of checkpoint ``checkpoint_path`` to ``out``; returns it.

    Raises:
        ValueError: the checkpoint is missing, damaged or without its ``config.yaml``, that
            config does not build a model the weights fit, or ``out`` (or its config sidecar)
            exists already.
    """
    out = Path(out)
    sidecar = out.with_name(out.name + ".config.yaml")
    for path in (out, sidecar):
        if path.exists():
            raise ValueError(f"{path} exists already; dmt-export never replaces a file")
    step_dir = find_checkpoint(checkpoint_path)
    config = step_dir / checkpoint.CONFIG_FILE
    if not config.is_file():
        raise ValueError(
            f"checkpoint {step_dir} has no {checkpoint.CONFIG_FILE} (the training config that "
            "builds its model, written with every checkpoint); copy the run's config there "
            "(<run>/.hydra/config.yaml)"
        )
    # the model its config.yaml builds, with the weights checked against it (dmt-eval's check):
    # the sidecar is what builds the model again
    state = load_model(open_checkpoint(step_dir)).state_dict()
    out.parent.mkdir(parents=True, exist_ok=True)
    # both files whole before either name appears: a kill while the model (minutes for a large
    # one) is written leaves neither, not a sidecar that a retry is refused for
    with (
        _staged(out, lambda f: torch.save(state, f)) as model_tmp,
        _staged(sidecar, lambda f: f.write(config.read_bytes())) as config_tmp,
    ):
        _link(config_tmp, sidecar)  # the sidecar first: a model file never stands without it
        try:
            _link(model_tmp, out)
        except BaseException:  # not a sidecar without its model: a retry would be refused for it
            sidecar.unlink(missing_ok=True)
            raise
    return out


def _publish(path: Path, write: Callable[[BinaryIO], object]) -> None:
    """Write ``path`` whole or not at all, never over a file (:func:`_staged`, :func:`_link`)."""
    with _staged(path, write) as tmp:
        _link(tmp, path)


@contextmanager
def _staged(path: Path, write: Callable[[BinaryIO], object]) -> Iterator[Path]:
    """A temporary file of its own beside ``path``, written by ``write`` and fsynced; removed
    when the block ends, in every case (once linked, ``path`` keeps its data)."""
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
        yield tmp
    finally:
        tmp.unlink(missing_ok=True)


def _link(tmp: Path, path: Path) -> None:
    """Link the whole file ``tmp`` to ``path`` and fsync the directory; fails if ``path`` exists
    (it may have appeared meanwhile, e.g. from a concurrent export)."""
    try:
        os.link(tmp, path)
    except FileExistsError:
        raise ValueError(f"{path} exists already; dmt-export never replaces a file") from None
    dir_fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


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
    stopped: list[int] = []

    def stop(signum: int, frame: object) -> None:
        """``SIGTERM`` (kill, timeout, a scheduler) as an exception, so that the temporary files
        are removed on the way out, as on an error."""
        stopped.append(signum)
        raise SystemExit(128 + signum)

    handler = signal.signal(signal.SIGTERM, stop)
    try:
        path = export(args.checkpoint, args.out)
    except BaseException as e:
        if stopped:  # torch.save's writer may raise its own error over the SystemExit
            print(f"dmt-export: stopped by {signal.Signals(stopped[0]).name}", file=sys.stderr)
            return 128 + stopped[0]
        if not isinstance(e, (ValueError, OSError)):  # OSError: e.g. no space for the output
            raise
        print(f"dmt-export: error: {e}", file=sys.stderr)
        return 1
    finally:
        signal.signal(signal.SIGTERM, handler)
    print(f"written to {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
