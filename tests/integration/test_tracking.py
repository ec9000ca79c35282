"""wandb on a cluster (dmt.tracking, real offline runs): the run id an online run resumes, steps
logged again after a resume kept, runs that failed marked so, and tracking that does not stop
training (no credentials, no run at all, a dead wandb service); WANDB_MODE; file systems without
flock (dmt.run_dir)."""

from __future__ import annotations

import errno
import json
import logging
import os
import pty
import re
import select
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import wandb
from omegaconf.errors import InterpolationResolutionError

import dmt.run_dir
import dmt.train
from dmt.config import LoggerConfig
from dmt.run_dir import lock_run_dir
from dmt.tracking import RUN_ID_FILE, STEP, WandbLogger, _run_id, open_logger
from dmt.train import to_config, train
from tests.conftest import compose_config, free_port, torchrun


@pytest.fixture(autouse=True)
def no_wandb_credentials(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """No API key, settings or netrc of the machine's user; nothing reaches the network."""
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("WANDB_CONFIG_DIR", str(home / ".config" / "wandb"))
    monkeypatch.setenv("WANDB_SILENT", "true")
    for var in ("WANDB_API_KEY", "WANDB_MODE", "WANDB_BASE_URL", "WANDB_RUN_ID", "WANDB_RESUME"):
        monkeypatch.delenv(var, raising=False)


def _open(run_dir: Path, mode: str = "offline") -> WandbLogger:
    logger = open_logger(LoggerConfig(mode=mode), {"x": 1}, run_dir, is_main=True)
    assert logger is not None
    return logger


def test_an_online_run_directory_keeps_its_wandb_run_id(tmp_path: Path) -> None:
    """The id an online run resumes (``resume="allow"``; not checked here: no wandb server)."""
    run_id = _run_id(tmp_path)
    assert (tmp_path / RUN_ID_FILE).read_text() == run_id + "\n"
    (tmp_path / "other").mkdir()
    assert _run_id(tmp_path) == run_id != _run_id(tmp_path / "other")
    (tmp_path / RUN_ID_FILE).write_text("\n")
    with pytest.raises(ValueError) as e:
        _run_id(tmp_path)
    assert str(e.value) == (
        f"{tmp_path / RUN_ID_FILE} is empty: expected the wandb run id this run directory uses"
    )


def test_offline_attempts_are_runs_of_their_own(tmp_path: Path) -> None:
    """wandb cannot resume offline runs: each attempt syncs as a run of its own."""
    ids = []
    for _ in range(2):
        logger = _open(tmp_path)
        ids.append(logger.run.id)
        logger.finish()
    assert ids[0] != ids[1]
    assert not (tmp_path / RUN_ID_FILE).exists()
    assert len(list((tmp_path / "wandb").glob("offline-run-*"))) == 2


def test_a_run_that_cannot_start_is_skipped(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    (tmp_path / "wandb").write_text("not a directory")
    with caplog.at_level(logging.ERROR, logger="dmt.tracking"):
        assert open_logger(LoggerConfig(mode="offline"), {}, tmp_path, is_main=True) is None
    assert [r.getMessage() for r in caplog.records if r.name == "dmt.tracking"] == [
        "wandb could not start a run; training goes on without wandb"
    ]
    logger = _open(tmp_path / "next")  # the next job of a multirun in this process
    logger.log({"train/loss": 1.0}, step=1)
    logger.finish()


def test_steps_logged_again_after_a_resume_are_kept(tmp_path: Path) -> None:
    """A run resumed from the checkpoint of step 4 logs steps 5.. again after wandb saw step
    10. wandb drops a step lower than its last (``log(step=)``): the step is a metric."""
    logger = _open(tmp_path)
    logger.log({"train/loss": 1.0}, step=10)
    logger.log({"train/loss": 0.5}, step=5)
    summary = dict(logger.run.summary)
    logger.finish()
    assert summary["train/loss"] == 0.5 and summary[STEP] == 5


def test_an_online_run_without_credentials_logs_offline(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING, logger="dmt.tracking"):
        logger = _open(tmp_path, mode="online")
    try:
        assert logger.run.settings.mode == "offline"
        logger.log({"train/loss": 1.0}, step=1)
    finally:
        logger.finish()
    assert any(
        r.getMessage().startswith("wandb could not start an online run (UsageError: No API key")
        and r.getMessage().endswith(
            f"logging offline to {tmp_path / 'wandb'} instead (upload it later with `wandb sync`)"
        )
        for r in caplog.records
    ), caplog.text
    assert list((tmp_path / "wandb").glob("offline-run-*"))


_ONLINE_ON_A_TERMINAL = """
import logging, sys
from pathlib import Path
from dmt.config import LoggerConfig
from dmt.tracking import open_logger

logging.basicConfig(level=logging.WARNING, format="%(name)s: %(message)s")
print("terminal", sys.stdin.isatty() and sys.stderr.isatty(), flush=True)
logger = open_logger(LoggerConfig(mode="online"), {}, Path(sys.argv[1]), is_main=True)
print("started", logger.run.settings.mode, flush=True)
logger.finish()
"""


def test_an_online_run_without_credentials_on_a_terminal_logs_offline(tmp_path: Path) -> None:
    """Reproduced: on a terminal (an interactive shell, a login node) without an API key,
    wandb asked "(1) Create a W&B account (2) Use an existing W&B account (3) Don't visualize my
    results / Enter your choice:" and waited for an answer, where dmt logs offline (a job's
    other ranks waited for rank 0 until their collective timeout). On a pseudo-terminal with
    wandb's messages on (no WANDB_SILENT), and a server on a closed loopback port."""
    env = {k: v for k, v in os.environ.items() if k not in ("WANDB_SILENT", "WANDB_SERVICE")}
    env["WANDB_BASE_URL"] = f"http://127.0.0.1:{free_port()}"
    main, terminal = pty.openpty()
    child = subprocess.Popen(
        [sys.executable, "-c", _ONLINE_ON_A_TERMINAL, str(tmp_path / "run")],
        stdin=terminal, stdout=terminal, stderr=terminal, env=env, start_new_session=True,
    )  # fmt: skip
    os.close(terminal)
    shown = b""
    try:
        while not re.search(rb"started \w+\r\n|Enter your choice", shown):
            if not select.select([main], [], [], 60)[0]:
                break  # nothing more within a minute
            try:
                shown += os.read(main, 4096)
            except OSError:  # the child closed the terminal
                break
    finally:
        child.kill()
        child.wait()
        os.close(main)
    text = shown.decode(errors="replace")
    assert "terminal True" in text and "Enter your choice" not in text, text
    assert "started offline" in text, text
    assert (
        "dmt.tracking: wandb could not start an online run (UsageError: No API key configured "
        f"for {env['WANDB_BASE_URL']}: log in with `wandb login` or set WANDB_API_KEY); logging "
        f"offline to {tmp_path / 'run' / 'wandb'} instead (upload it later with `wandb sync`)"
    ) in text.replace("\r\n", "\n"), text


def _no_server(monkeypatch: pytest.MonkeyPatch) -> str:
    """An API key for a wandb server nobody serves (a closed loopback port): no network."""
    url = f"http://127.0.0.1:{free_port()}"
    monkeypatch.setenv("WANDB_API_KEY", "a" * 40)
    monkeypatch.setenv("WANDB_BASE_URL", url)
    return url


def _online_timeout(run_dir: Path) -> str:
    """The timeout the online attempt in ``run_dir`` gave wandb's server (wandb's own log)."""
    (debug,) = (run_dir / "wandb").glob("run-*/logs/debug.log")
    (line,) = [line for line in debug.read_text().splitlines() if "second timeout" in line]
    return line.split("communicating run to backend with ")[1]


def test_an_online_run_waits_for_an_unreachable_server_at_most_as_bounded(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A reproduced bug: rank 0 waited for wandb's server wandb's ``init_timeout`` (90 s),
    while the other ranks waited for it in their first collective, which failed after a
    shorter ``trainer.collective_timeout_s`` (the job failed: see the next test). A bound
    above the user's ``WANDB_INIT_TIMEOUT`` keeps the user's."""
    _no_server(monkeypatch)
    for env, wait_s, timeout in ((None, 2.0, "2.0"), ("1", 2.0, "1.0")):
        if env is not None:
            monkeypatch.setenv("WANDB_INIT_TIMEOUT", env)
        wandb.teardown()  # wandb reads its environment when it starts in a process
        run_dir = tmp_path / f"run{timeout}"
        with caplog.at_level(logging.INFO, logger="dmt.tracking"):
            logger = open_logger(
                LoggerConfig(mode="online"), {}, run_dir, is_main=True, wait_s=wait_s
            )
        assert logger is not None
        try:
            assert logger.run.settings.mode == "offline"  # the fallback
        finally:
            logger.finish()
        assert _online_timeout(run_dir) == f"{timeout} second timeout"
    wandb.teardown()  # this environment's settings stay with this test
    bounded = [r.getMessage() for r in caplog.records if "bounded" in r.getMessage()]
    assert bounded == [
        "wandb's init_timeout 90 s bounded to 2 s (half of trainer.collective_timeout_s: the "
        "other ranks wait for rank 0 while it reaches wandb's server)"
    ]


@pytest.mark.slow  # a 2-rank run under torchrun (about 50 s on 2 shared cores)
def test_two_ranks_train_on_while_rank_0_cannot_reach_wandbs_server(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A reproduced bug: with ``trainer.collective_timeout_s=30`` the job failed (gloo's "Timed
    out waiting 30000ms for recv operation" on rank 1) while rank 0 waited 90 s for wandb's
    server before logging offline. One wandb run, rank 0's, offline."""
    _no_server(monkeypatch)
    tiny = ["logger.mode=online", "trainer.progress_bar=false", "data.synthetic.num_train=1024",
            "data.synthetic.num_val=256", "data.synthetic.num_test=256", "data.batch_size=256",
            "trainer.collective_timeout_s=30", f"hydra.run.dir={tmp_path / 'run'}"]  # fmt: skip
    cmd, env = torchrun("-m", "dmt.train", *tiny)
    done = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, (done.stdout + done.stderr)[-4000:]
    run = tmp_path / "run"
    assert json.loads((run / "metrics.json").read_text())["num_steps"] == 4
    assert _online_timeout(run) == "15.0 second timeout"
    assert len(list((run / "wandb").glob("offline-run-*"))) == 1
    assert len(list((run / "wandb").glob("run-*"))) == 1  # the online attempt, rank 0's


_KILL_SERVICE = """
import logging, os, signal, subprocess, sys
from pathlib import Path
from dmt.config import LoggerConfig
from dmt.tracking import open_logger

logging.basicConfig(level=logging.ERROR, format="%(name)s: %(message)s", stream=sys.stdout)
logger = open_logger(LoggerConfig(mode="offline"), {}, Path(sys.argv[1]), is_main=True)
ps = subprocess.run(["ps", "-o", "pid=,comm=", "--ppid", str(os.getpid())],
                    capture_output=True, text=True).stdout.split("\\n")
service = [int(line.split()[0]) for line in ps if "wandb" in line]
assert service, ps
for pid in service:  # wandb-core: killed as the OOM killer would
    os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)
logger.log({"train/loss": 1.0}, step=1)
print("after the failed log, run", logger.run)  # logging stopped there
logger.log({"train/loss": 1.0}, step=2)
logger.summarize({"test/auc": 0.7})
logger.finish(exit_code=0)
print("trained on")
# the next job of a multirun in this process: a service of its own, and a run that logs
nxt = open_logger(LoggerConfig(mode="offline"), {}, Path(sys.argv[1]) / "next", is_main=True)
print("next run started", nxt.run is not None)
nxt.log({"train/loss": 1.0}, step=1)
print("next run logging", nxt.run is not None)
nxt.finish()
"""


def test_a_dead_wandb_service_stops_logging_not_training(tmp_path: Path) -> None:
    """In a process of its own, with a service of its own (not this process's, which
    ``WANDB_SERVICE`` names once a run has started here)."""
    env = {k: v for k, v in os.environ.items() if k != "WANDB_SERVICE"}
    done = subprocess.run(
        [sys.executable, "-c", _KILL_SERVICE, str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    lines = done.stdout.splitlines()
    assert lines[0] == "dmt.tracking: wandb failed (log); logging to wandb stops, training goes on"
    assert "after the failed log, run None" in lines
    assert lines[-3:] == ["trained on", "next run started True", "next run logging True"]
    assert sum("wandb failed" in line for line in lines) == 1  # once, then no more calls
    # the next job's run was written (offline), the failed one's service gone with its run
    assert len(list((tmp_path / "next" / "wandb").glob("offline-run-*"))) == 1


class _Recording:
    """A real logger whose calls are recorded; ``continued``: what wandb's server says of the
    run (``run.resumed``), which an offline run cannot be."""

    def __init__(self, logger: WandbLogger, continued: bool | None = None) -> None:
        self.logger, self.exit_codes = logger, []  # type: list[int]
        self.logged: list[tuple[int, list[str]]] = []
        self.summaries: list[dict[str, float]] = []
        self.continued = logger.continued if continued is None else continued

    def log(self, values: dict[str, float], step: int) -> None:
        self.logged.append((step, sorted(values)))
        self.logger.log(values, step)

    def summarize(self, values: dict[str, float]) -> None:
        self.summaries.append(values)
        self.logger.summarize(values)

    def finish(self, exit_code: int = 0) -> None:
        self.exit_codes.append(exit_code)
        self.logger.finish(exit_code)


def test_a_run_that_fails_finishes_its_wandb_run_as_failed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    loggers: list[_Recording] = []

    def recording(*args: Any, **kwargs: Any) -> _Recording:
        logger = open_logger(*args, **kwargs)
        assert logger is not None
        loggers.append(_Recording(logger))
        return loggers[-1]

    monkeypatch.setattr(dmt.train, "open_logger", recording)
    conf = to_config(
        compose_config("logger.mode=offline", f"trainer.resume_from={tmp_path / 'nowhere'}")
    )
    with pytest.raises(ValueError, match="no complete checkpoint"):
        train(conf, tmp_path / "run")
    assert [r.exit_codes for r in loggers] == [[1]]
    small = ["data.synthetic.num_train=512", "data.batch_size=256", "trainer.progress_bar=false"]
    train(to_config(compose_config("logger.mode=offline", *small)), tmp_path / "ok")
    assert [r.exit_codes for r in loggers] == [[1], [0]]


def test_wandb_mode_comes_from_the_environment_unless_set(monkeypatch: pytest.MonkeyPatch) -> None:
    assert to_config(compose_config()).logger.mode == "offline"
    for env, mode in (("disabled", "disabled"), ("dryrun", "offline"), ("run", "online")):
        monkeypatch.setenv("WANDB_MODE", env)
        assert to_config(compose_config()).logger.mode == mode
    assert to_config(compose_config("logger.mode=online")).logger.mode == "online"
    monkeypatch.setenv("WANDB_MODE", "shared")  # wandb's, but no mode of dmt's
    with pytest.raises(InterpolationResolutionError) as e:
        to_config(compose_config())
    assert (
        "the environment variable WANDB_MODE='shared' (logger.mode's default) is not one of "
        "['online', 'offline', 'disabled'] (or wandb's dryrun, run); unset it or set logger.mode"
    ) in str(e.value)
    for env in ("bogus", ""):  # nor wandb's: see the next test
        monkeypatch.setenv("WANDB_MODE", env)
        with pytest.raises(InterpolationResolutionError) as e:
            to_config(compose_config())
        assert f"the environment variable WANDB_MODE={env!r} is not one of" in str(e.value)


def _recorded_run(run_dir: Path) -> tuple[str, str, str]:
    """The id, entity and project an offline run in ``run_dir`` recorded: its run record (the
    protobuf ``RunRecord``'s fields 1-3 in wandb's run file), which ``wandb sync`` uploads."""
    (run_file,) = (run_dir / "wandb").glob("offline-run-*/run-*.wandb")
    run_id = run_file.stem.removeprefix("run-").encode()
    data = run_file.read_bytes()
    start = data.index(b"\n" + bytes([len(run_id)]) + run_id + b"\x12") + len(run_id) + 4
    entity = data[start : start + data[start - 1]]
    start += len(entity) + 2
    assert data[start - 2] == 0x1A  # field 3: the project
    return run_id.decode(), entity.decode(), data[start : start + data[start - 1]].decode()


@pytest.mark.parametrize(
    ("overrides", "expected"),
    [
        ((), ("envteam", "envproject")),
        (("logger.project=cliproject", "logger.entity=cliteam"), ("cliteam", "cliproject")),
    ],
)
def test_the_wandb_project_comes_from_the_environment_unless_set(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, overrides: tuple[str, ...], expected: Any
) -> None:
    """Reproduced: a job script's WANDB_PROJECT was ignored, the run recorded in project "dmt":
    wandb takes the project it is given over its variable, and dmt gave the config's default.
    ``logger.project=`` wins, else WANDB_PROJECT, else dmt; the entity alike (WANDB_ENTITY)."""
    monkeypatch.setenv("WANDB_PROJECT", "envproject")
    monkeypatch.setenv("WANDB_ENTITY", "envteam")
    wandb.teardown()  # wandb reads its environment when it starts in a process
    try:
        cfg = to_config(compose_config("logger.mode=offline", *overrides)).logger
        logger = open_logger(cfg, {}, tmp_path / "env", is_main=True)
        assert logger is not None
        run_id = logger.run.id
        logger.finish()
        wandb.teardown()  # its service has written the run file
        assert _recorded_run(tmp_path / "env") == (run_id, *expected)
        monkeypatch.delenv("WANDB_PROJECT")
        cfg = to_config(compose_config("logger.mode=offline", *overrides)).logger
        logger = open_logger(cfg, {}, tmp_path / "unset", is_main=True)
        assert logger is not None
        logger.finish()
        wandb.teardown()
        assert _recorded_run(tmp_path / "unset")[2] == ("dmt" if not overrides else "cliproject")
    finally:
        wandb.teardown()  # this environment's settings stay with this test


def test_a_wandb_mode_wandb_does_not_know_stops_the_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A reproduced bug: wandb reads WANDB_MODE whatever mode it is given, and did not start on
    a value it does not know (an empty one too, which dmt took for offline), so the run trained
    without wandb, with only a traceback in its log."""
    small = ["data.synthetic.num_train=512", "data.batch_size=256", "trainer.progress_bar=false"]
    for env in ("bogus", "", " offline"):
        monkeypatch.setenv("WANDB_MODE", env)
        run = tmp_path / f"run{len(env)}"
        with pytest.raises(ValueError) as e:
            train(to_config(compose_config("logger.mode=offline", *small)), run)
        assert str(e.value) == (
            f"the environment variable WANDB_MODE={env!r} is not one of ['online', 'offline', "
            "'disabled', 'dryrun', 'run', 'shared']: wandb reads it whatever logger.mode says, "
            "and would not start; unset it or set one of those (logger=disabled: no wandb)"
        )
        assert not (run / "history.jsonl").exists()  # stopped before training
    train(to_config(compose_config("logger=disabled", *small)), tmp_path / "disabled")
    assert not (tmp_path / "disabled" / "wandb").exists()
    monkeypatch.setenv("WANDB_MODE", "shared")  # wandb's: logger.mode wins
    logger = _open(tmp_path / "shared")
    assert logger.run.settings.mode == "offline"
    logger.finish()


def test_a_file_system_without_flock_is_named(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """NFSv3 without lockd answers ENOLCK (simulated: this machine's file systems lock)."""

    def no_locks(fd: int, operation: int) -> None:
        raise OSError(errno.ENOLCK, os.strerror(errno.ENOLCK))

    monkeypatch.setattr(dmt.run_dir.fcntl, "flock", no_locks)
    fds = len(os.listdir("/proc/self/fd"))
    with pytest.raises(ValueError) as e:
        lock_run_dir(tmp_path)
    assert str(e.value) == (
        f"cannot lock {tmp_path / 'run.lock'}: No locks available (ENOLCK): its file system does "
        "not support flock, which keeps a second run out of a live run's directory; mount it "
        "with locking (NFS: lockd or NFSv4; Lustre: -o flock), or choose a hydra.run.dir "
        "(hydra.sweep.dir) on a file system that has it"
    )
    assert len(os.listdir("/proc/self/fd")) == fds  # the lock file's descriptor is closed


def test_a_diverged_runs_summary_keeps_its_nan(tmp_path: Path) -> None:
    # a reproduced bug: wandb's summary drops a float NaN, so a diverged run's final loss was
    # missing from its summary instead of saying it diverged
    logger = _open(tmp_path)
    logger.summarize({"train/loss_last": float("nan"), "val/auc": 0.7, "x": float("-inf")})
    summary = dict(logger.run.summary)
    logger.finish()
    assert (summary["train/loss_last"], summary["val/auc"], summary["x"]) == ("nan", 0.7, "-inf")


def test_a_resumed_run_that_had_ended_logs_its_evaluations_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A reproduced bug: resuming an online run that had ended evaluated it again and logged
    the evaluations a second time at the same step of the continued wandb run. An attempt that
    is a run of its own (offline) logs them in it."""
    loggers: list[_Recording] = []
    continued: list[bool | None] = [None]

    def recording(*args: Any, **kwargs: Any) -> _Recording:
        logger = open_logger(*args, **kwargs)
        assert logger is not None
        loggers.append(_Recording(logger, continued[0]))
        return loggers[-1]

    monkeypatch.setattr(dmt.train, "open_logger", recording)
    small = ["data.synthetic.num_train=512", "data.batch_size=256", "trainer.progress_bar=false"]
    small += ["trainer.max_steps=2", "trainer.checkpoint=true", "logger.mode=offline"]
    run = tmp_path / "run"
    train(to_config(compose_config(*small)), run)
    assert not loggers[0].continued  # offline
    evaluations = [(step, keys) for step, keys in loggers[0].logged if "val/auc" in keys]
    evaluations += [(step, keys) for step, keys in loggers[0].logged if "test/auc" in keys]
    assert [step for step, _ in evaluations] == [2, 2]
    for seen_by_the_server in (True, False):
        continued[0] = seen_by_the_server
        train(to_config(compose_config(*small, "trainer.resume_from=auto")), run)
        logged = [(step, keys) for step, keys in loggers[-1].logged if "train/loss" not in keys]
        assert logged == ([] if seen_by_the_server else evaluations)
        assert loggers[-1].exit_codes == [0]
        # the summary has this attempt's evaluations
        metrics = json.loads((run / "metrics.json").read_text())
        (summary,) = loggers[-1].summaries
        assert summary["test/auc"] == metrics["test_auc"] and "val/auc" in summary
