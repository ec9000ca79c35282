"""``dmt-plan``'s run directory: no plan over another run's outputs.

:class:`PlanRunDirGuard` (a Hydra callback, ``conf/plan.yaml``) refuses a run directory before
Hydra writes ``.hydra/`` and the log there when it holds

* a training run's outputs (``metrics.json``, a non-empty ``trainer.checkpoint_dir``:
  :func:`dmt.run_dir.outputs_of`) or a live run's lock (``run.lock`` held): a plan never writes
  its ``.hydra/`` record over a training run's, whatever ``overwrite`` says;
* an earlier plan's ``plan.json``, unless ``overwrite=true``;
* a file where the directory (or one above it) goes, or a ``plan.json`` that is no regular file
  (a directory), whatever ``overwrite`` says.

It checks the settings there too (:func:`dmt.planning.app.check_plan_config`): a mistyped
setting stops before Hydra makes the run directory, or, with ``overwrite=true``, writes its
``.hydra/`` record over the earlier plan's (both stay).

:func:`write_run_output` (:func:`dmt.planning.app.main`) applies the same checks again when it
writes ``plan.json`` (jobs of a sweep, runs started from Python); without ``overwrite`` the file
is put in place only if no other plan wrote one since (``write_json(..., replace=False)``), with
it the earlier file is replaced only by the new one, or removed if planning fails, since Hydra
has written this run's ``.hydra/`` beside it by then. ``dmt-inspect`` (``inspect.json``,
:class:`dmt.inspect.InspectRunDirGuard`) uses the same guard and writer. Training's
:class:`dmt.run_dir.RunDirGuard` does not fit a plan: it would let ``trainer.resume_from=auto``
through into a training run's directory, proposes resuming, takes a lock a plan does not need
and knows nothing of ``plan.json``.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hydra.experimental.callback import Callback
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from dmt.results import file_in_the_way, write_json
from dmt.run_dir import JOB_NUM_FORMS, LOCK_FILE, job_config, job_dirs, lock_held, outputs_of

PLAN_FILE = "plan.json"


@dataclass(frozen=True)
class RunOutput:
    """The file a planning tool writes into its Hydra run directory, as errors name it."""

    file: str
    """Its name in the run directory (``plan.json``)."""
    what: str
    """What it holds (``plan``)."""
    tool: str
    """The command that writes it (``dmt-plan``)."""


PLAN = RunOutput(PLAN_FILE, "plan", "dmt-plan")


def check_plan_dir(
    run_dir: Path,
    *,
    overwrite: bool,
    checkpoint_dir: str = "checkpoints",
    setting: str = "hydra.run.dir",
    output: RunOutput = PLAN,
) -> None:
    """Raise ``ValueError`` if ``output.tool`` may not write into ``run_dir`` (see the module
    docstring); ``setting`` is the one to change that the error names."""
    run_dir = run_dir.absolute()
    if (blocking := file_in_the_way(run_dir)) is not None:
        raise ValueError(
            f"run directory {run_dir}: {blocking} is not a directory; choose another {setting} "
            "(or leave it unset for a new one)"
        )
    if not run_dir.is_dir():
        return
    training = outputs_of(run_dir, checkpoint_dir)
    if training or lock_held(run_dir):
        what = ", ".join(training) if training else f"{LOCK_FILE}, held by a live run"
        raise ValueError(
            f"run directory {run_dir} holds a training run's outputs ({what}): {output.tool} "
            f"would write its .hydra/ record over that run's; choose another {setting} (or "
            "leave it unset for a new one)"
        )
    target = run_dir / output.file
    if target.exists() and not target.is_file():
        raise ValueError(
            f"run directory {run_dir} holds {target}, which is not a regular file as "
            f"{output.tool} writes there: not replaced, even with overwrite=true; choose another "
            f"{setting} (or leave it unset for a new one)"
        )
    if target.exists() and not overwrite:
        raise ValueError(
            f"run directory {run_dir} already holds an earlier {output.what} ({output.file}); "
            f"choose another {setting} (or leave it unset for a new one), or set "
            "overwrite=true to replace it"
        )


def write_run_output(
    run_dir: Path,
    make: Callable[[], dict[str, Any]],
    *,
    overwrite: bool,
    checkpoint_dir: str = "checkpoints",
    output: RunOutput = PLAN,
) -> dict[str, Any]:
    """Check ``run_dir`` (:func:`check_plan_dir`), then write what ``make`` returns there as
    ``output.file`` (:func:`dmt.results.write_json`: whole or not at all), and return it.

    With ``overwrite`` an earlier file stays until the new one replaces it; if ``make`` fails
    it is removed: Hydra has written this run's ``.hydra/`` record by then, and a run that
    fails leaves no ``output.file`` of other settings beside it. (A run whose settings fail
    their checks stops earlier, in :class:`PlanRunDirGuard`, and leaves both.) Without
    ``overwrite`` a file another run wrote since the check is not replaced."""
    check_plan_dir(run_dir, overwrite=overwrite, checkpoint_dir=checkpoint_dir, output=output)
    path = run_dir / output.file
    try:
        data = make()
    except BaseException:
        if overwrite:
            path.unlink(missing_ok=True)
        raise
    try:
        # not over a file another run wrote into this directory since the check
        write_json(path, data, replace=overwrite)
    except FileExistsError:
        check_plan_dir(run_dir, overwrite=False, checkpoint_dir=checkpoint_dir, output=output)
        raise
    return data


def _settings(config: DictConfig) -> tuple[bool, str]:
    overwrite = OmegaConf.select(config, "overwrite", default=False)
    if not isinstance(overwrite, bool):
        raise ValueError(f"overwrite={overwrite!r} must be true or false")
    checkpoint_dir = OmegaConf.select(config, "trainer.checkpoint_dir", default="checkpoints")
    return overwrite, str(checkpoint_dir)


@contextmanager
def one_line_errors() -> Iterator[None]:
    """A planning tool's ``ValueError`` (a layout that does not fit, settings that cannot be
    planned) as one ``Error:`` line and exit status 1, not a traceback; with
    ``HYDRA_FULL_ERROR=1`` the traceback, as Hydra gives it."""
    try:
        yield
    except ValueError as e:
        if os.environ.get("HYDRA_FULL_ERROR") == "1":
            raise
        sys.exit(f"Error: {e}")


class PlanRunDirGuard(Callback):
    """Hydra callback: refuse a plan's run directory (:func:`check_plan_dir`) or its settings
    (:meth:`check_config`) before Hydra writes ``.hydra/`` and the log there (exit status 1 and
    the error on stderr), and a sweep directory whose numbered job directories would be
    refused."""

    output: RunOutput = PLAN

    def check_config(self, conf: Any) -> None:
        """Raise ``ValueError`` for settings that would fail the run (``conf``: the job's typed
        config): :func:`dmt.planning.app.check_plan_config`."""
        from dmt.planning.app import check_plan_config  # noqa: PLC0415 (app imports this module)

        check_plan_config(conf)

    def on_run_start(self, config: DictConfig, **kwargs: Any) -> None:
        run_dir = Path(str(config.hydra.run.dir))
        try:
            overwrite, checkpoint_dir = _settings(config)
            check_plan_dir(
                run_dir, overwrite=overwrite, checkpoint_dir=checkpoint_dir, output=self.output
            )
        except ValueError as e:
            # Hydra turns a callback's exception into a warning and runs the job anyway
            sys.exit(f"Error: {e}")
        # Hydra is about to make the run directory, or to write this run's .hydra/ over an
        # earlier file's record: a setting that fails stops here, and leaves no directory of a
        # run that never started, or both as they are
        try:
            self.check_config(job_config(config))
        except (ValueError, OmegaConfBaseException) as e:
            kept = (
                f"\n(nothing written: the earlier {self.output.file} in {run_dir.absolute()} and "
                "its .hydra/ record are kept)"
                if overwrite and (run_dir / self.output.file).exists()
                else ""
            )
            sys.exit(f"Error: {e}{kept}")

    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        """With a ``hydra.sweep.subdir`` of job numbers (the default; they start from 0 again),
        every existing job directory of the sweep directory is checked; other subdirs are
        checked job by job when ``plan.json`` is written."""
        sweep = OmegaConf.to_container(config.hydra.sweep, resolve=False)
        subdir = str(sweep.get("subdir", "")) if isinstance(sweep, dict) else ""
        sweep_dir = Path(str(config.hydra.sweep.dir)).absolute()
        if (blocking := file_in_the_way(sweep_dir)) is not None:
            sys.exit(
                f"Error: sweep directory {sweep_dir}: {blocking} is not a directory; choose "
                "another hydra.sweep.dir (or leave it unset for a new one)"
            )
        if not any(form in subdir for form in JOB_NUM_FORMS) or not sweep_dir.is_dir():
            return
        try:
            overwrite, checkpoint_dir = _settings(config)
            for job in job_dirs(sweep_dir, subdir):
                check_plan_dir(
                    job,
                    overwrite=overwrite,
                    checkpoint_dir=checkpoint_dir,
                    setting="hydra.sweep.dir",
                    output=self.output,
                )
        except ValueError as e:
            sys.exit(f"Error: sweep directory {sweep_dir}: {e}")
