"""Results files of benchmarks and reports: never over an earlier run's, never half-written,
standard JSON (and arrays, ``.npz``).

A benchmark runs for minutes to hours, so an existing results file is refused when the command
starts (:func:`existing_output`), not when it ends, and the file is written through a temporary
file and a rename (:func:`write_json`). The other checks a benchmark's command line shares are
here too (:func:`check_runs`, :func:`check_counts`, and :func:`compose_or_exit` for its Hydra
overrides), so that every bad argument is a one-line error before any work starts.
"""

from __future__ import annotations

import argparse
import importlib.resources
import json
import math
import os
import re
import sys
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import numpy as np

if TYPE_CHECKING:
    from dmt.config import Config


def file_in_the_way(directory: str | os.PathLike[str]) -> Path | None:
    """The file that would stop ``directory`` from being made: its nearest existing part
    (itself or an ancestor; the missing ones are made when written into) if that is not a
    directory, else ``None``."""
    existing = Path(os.path.abspath(directory))
    while not existing.exists():
        existing = existing.parent
    return None if existing.is_dir() else existing


def existing_output(
    path: str | os.PathLike[str] | None,
    option: str,
    overwrite: bool,
    *,
    kind: str = "json",
    inputs: Sequence[str | os.PathLike[str]] = (),
) -> str | None:
    """The error for a command about to write ``path`` (given as ``option``), or ``None`` if it
    may be written: an earlier run's file is refused unless ``overwrite``; even with it, a file
    that is one of the command's ``inputs``, or that is not a file of the ``kind`` the command
    writes (``"json"``, or ``"npz"``: a NumPy archive), is refused. dmt replaces only what it
    could have written there, never a user's notes or data that happen to have the name."""
    if path is None:
        return None
    target = Path(path)
    if any(target.resolve() == Path(p).resolve() for p in inputs):
        return f"{option} {path} is one of the command's input files; write elsewhere"
    if not target.exists() and not target.is_symlink():
        blocking = file_in_the_way(target.absolute().parent)
        return None if blocking is None else f"{option} {path}: {blocking} is not a directory"
    if target.is_dir():
        return f"{option} {path} is a directory; give the path of a file"
    if not overwrite:
        return (
            f"{option} {path} exists already (an earlier run's results); choose another file, or "
            "pass --overwrite to replace it"
        )
    if kind not in _KINDS:
        raise ValueError(f"kind={kind!r} is not one of {list(_KINDS)}")
    if (why := _not_of_kind(target, kind)) is not None:
        return (
            f"{option} {path} exists and is not {_KINDS[kind]}, as dmt writes there ({why}): "
            "not replaced, even with --overwrite; choose another file"
        )
    return None


_KINDS = {"json": "a JSON file", "npz": "a NumPy .npz archive"}


def _not_of_kind(path: Path, kind: str) -> str | None:
    """Why ``path`` is not a regular file of ``kind`` (``"json"`` or ``"npz"``); ``None`` if
    it is one."""
    if path.is_symlink() or not path.is_file():
        return "not a regular file"
    try:
        if kind == "json":
            json.loads(path.read_text(encoding="utf-8"))
        else:
            loaded = np.load(path, allow_pickle=False)
            if not isinstance(loaded, np.lib.npyio.NpzFile):
                return "a single array, not an archive"
            loaded.close()
    except (OSError, ValueError, EOFError) as e:  # JSONDecodeError, UnicodeDecodeError too
        return f"{type(e).__name__}: {e}"
    return None


def strict(data: Any) -> Any:
    """``data`` with every NaN or infinite float as ``None``: standard JSON has no NaN (Python
    writes a bare ``NaN`` that strict readers, e.g. ``jq`` or JavaScript, refuse)."""
    if isinstance(data, float) and not math.isfinite(data):
        return None
    if isinstance(data, dict):
        return {k: strict(v) for k, v in data.items()}
    if isinstance(data, list | tuple):
        return [strict(v) for v in data]
    return data


def write_json(
    path: str | os.PathLike[str],
    data: Any,
    *,
    indent: int = 2,
    standard: bool = True,
    replace: bool = True,
) -> Path:
    """Write ``data`` as standard JSON (:func:`strict`: NaN as ``null``; ``standard=False``:
    Python's, NaN as ``NaN``, for files whose readers take NaN as a float) to ``path``
    atomically: a reader sees the old file or the new one, never a part. ``replace=False``:
    raise ``FileExistsError`` if ``path`` exists, checked as the file is put in place (a file
    another process wrote since the caller looked is not replaced)."""
    text = (
        json.dumps(strict(data), indent=indent, allow_nan=False)
        if standard
        else json.dumps(data, indent=indent)
    )
    return write_atomic(path, lambda tmp: tmp.write_text(text + "\n"), replace)


def write_npz(
    path: str | os.PathLike[str], arrays: dict[str, np.ndarray], *, replace: bool = True
) -> Path:
    """Write ``arrays`` as an uncompressed ``.npz`` (``numpy.load(path)[name]``) to ``path``,
    atomically and with ``replace`` as :func:`write_json`."""

    def write(tmp: Path) -> None:
        with tmp.open("wb") as f:  # a file object: savez would append ".npz" to a name
            np.savez(f, **cast(dict[str, Any], arrays))

    return write_atomic(path, write, replace)


def write_atomic(
    path: str | os.PathLike[str], write: Callable[[Path], object], replace: bool = True
) -> Path:
    """``write`` a temporary file beside ``path``, then put it in place (:func:`os.replace`, or
    :func:`_put_new` when not ``replace``); the temporary file never outlives a failure."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        write(tmp)
        if replace:
            os.replace(tmp, path)
        else:
            _put_new(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return path


def _put_new(tmp: Path, path: Path) -> None:
    """Move ``tmp`` to ``path``, which must not exist (``FileExistsError``)."""
    try:
        os.link(tmp, path)  # fails if path exists, whoever made it
    except FileExistsError:
        raise FileExistsError(f"{path} already exists: not replaced") from None
    except OSError:  # a file system without hard links: claim the name, then fill it
        try:
            os.close(os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644))
        except FileExistsError:
            raise FileExistsError(f"{path} already exists: not replaced") from None
        os.replace(tmp, path)
    else:
        tmp.unlink()


def load_average() -> str:
    """The machine's 1-, 5- and 15-minute load averages, for a benchmark's report (the machine
    may be shared: a result says how loaded it was)."""
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


#: a timing benchmark's least number of runs: a median of fewer is not a result
MIN_RUNS = 3


def add_runs_options(parser: argparse.ArgumentParser, help: str, default: int = MIN_RUNS) -> None:
    """``--runs`` (``help``, at least :data:`MIN_RUNS`) and ``--smoke`` (fewer, not a result)."""
    parser.add_argument("--runs", type=int, default=default, help=f"{help} (at least {MIN_RUNS})")
    parser.add_argument(
        "--smoke",
        action="store_true",
        help=f"allow --runs below {MIN_RUNS}: a check that the script runs, not a result",
    )


def check_runs(parser: argparse.ArgumentParser, runs: int, smoke: bool, what: str = "") -> None:
    """Refuse (``parser.error``) fewer than :data:`MIN_RUNS` runs unless ``smoke``, which is said
    on stderr; ``what``: the unit after "run(s)" in that warning (e.g. " per tool")."""
    if runs < 1 or (runs < MIN_RUNS and not smoke):
        parser.error(
            f"--runs {runs}: a median of fewer than {MIN_RUNS} runs is not a result "
            "(pass --smoke, with --runs 1 or more, to only check that the script runs)"
        )
    if smoke:
        print(
            f"WARNING: --smoke: {runs} run(s){what}; these figures are NOT a result",
            file=sys.stderr,
            flush=True,
        )


def check_counts(
    parser: argparse.ArgumentParser,
    args: argparse.Namespace,
    at_least_one: Sequence[str],
    at_least_zero: Sequence[str] = (),
) -> None:
    """Refuse (``parser.error``) an option of ``args`` (by its attribute name, e.g.
    ``"trace_steps"`` for ``--trace-steps``) below 1, or below 0 for ``at_least_zero``."""
    for least, names in ((1, at_least_one), (0, at_least_zero)):
        for name in names:
            if getattr(args, name) < least:
                parser.error(f"--{name.replace('_', '-')} must be at least {least}")


def config_options(group: str) -> list[str]:
    """The options of the Hydra config group ``group`` (``dmt/conf/<group>/*.yaml``), sorted:
    what a benchmark can check a list of names against before it starts."""
    folder = importlib.resources.files("dmt.conf") / group
    if not folder.is_dir():
        raise ValueError(f"dmt.conf has no config group {group!r}")
    return sorted(
        e.name.removesuffix(".yaml") for e in folder.iterdir() if e.name.endswith(".yaml")
    )


def compose_or_exit(
    parser: argparse.ArgumentParser,
    overrides: Sequence[str],
    given: Sequence[str] | Mapping[str, str] = (),
) -> Config:
    """The validated config of ``overrides`` (``dmt.train.to_config(compose_config(...))``), or
    ``parser.error`` (exit 2, one line) with the library's own message, for a benchmark that
    composes dmt's config before it starts its work.

    ``given``: the overrides among ``overrides`` that the user gave, named in the error; as a
    mapping, each with the way it was given (``{"data=foo": "--data foo"}``). The error names
    those whose key the message mentions (Hydra's and ``validate``'s messages name the setting),
    else all of them, instead of a traceback from deep inside Hydra."""
    from hydra.errors import HydraException  # noqa: PLC0415  (Hydra and torch: only when used)
    from omegaconf.errors import OmegaConfBaseException  # noqa: PLC0415

    from dmt.train import compose_config, to_config  # noqa: PLC0415

    try:
        return to_config(compose_config(*overrides))
    except (ValueError, HydraException, OmegaConfBaseException) as e:
        message = _one_line(e)
    labels = dict(given) if isinstance(given, Mapping) else {o: f"override {o}" for o in given}
    named = [
        label
        for override, label in labels.items()
        if re.search(rf"(?<![\w.]){re.escape(_override_key(override))}(?![\w.])", message)
    ] or list(labels.values())
    parser.error(f"{', '.join(named)}: {message}" if named else message)


def _override_key(override: str) -> str:
    """The config key (or group) a Hydra override sets: ``+trainer.foo=1`` -> ``trainer.foo``."""
    return override.lstrip("+~").split("=", 1)[0]


def _one_line(error: BaseException) -> str:
    """``error``'s message on one line, with its cause's where Hydra only says what it was doing
    ("Error merging override ..."), without Hydra's search path."""
    message = " ".join(str(error).split())  # Hydra's lists of options span lines
    cause = error.__cause__
    if cause is not None and str(cause) and str(cause) not in str(error):
        message = f"{message}: {' '.join(str(cause).split())}"
    return message.split(" Config search path:", 1)[0]


@contextmanager
def output_directory(path: Path) -> Iterator[Path]:
    """Make ``path`` (and missing parents) for a command's outputs; if the command fails, the
    directories this made are removed again where they are empty (a failing command clears
    its own files first), never one that was there before."""
    created = [d for d in (path, *path.parents) if not d.exists()]  # deepest first
    path.mkdir(parents=True, exist_ok=True)
    try:
        yield path
    except BaseException:
        for d in created:
            if d.is_dir() and not any(d.iterdir()):
                d.rmdir()
        raise
