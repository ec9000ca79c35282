"""Run directories (dmt/run_dir.py): unique names, the lock, and the outputs check."""

from __future__ import annotations

import io
import logging
import os
import re
import signal
import socket
import subprocess
import sys
import warnings
from datetime import datetime
from pathlib import Path

import pytest
import torch.distributed as dist
from hydra.utils import instantiate
from omegaconf import OmegaConf

from dmt.planning.run_dir import PlanRunDirGuard
from dmt.run_dir import (
    INIT_PID_NAMESPACE,
    LOCK_FILE,
    STALE_LOCK_WAIT_S,
    RunDirGuard,
    WarningsToLog,
    _resolve_run_stamp,
    agreed_stamp,
    check_outputs,
    checkpoint_dir_outside,
    claim,
    claim_run_dir,
    held_by_another,
    job_refused,
    launch_rank,
    lock_held,
    lock_run_dir,
    outputs_of,
    rank_log_suffix,
    resumes,
    run_stamp,
    slurm_stamp,
    stale_lock_wait,
    stamp_host,
)
from dmt.runtime import TORCHRUN_VARS
from dmt.train import CONF_MODULE
from tests.conftest import REPO, free_port

SECOND = datetime(2025, 1, 31, 14, 3, 59, 0)


def test_runs_started_in_the_same_second_get_different_directories():
    a, b = run_stamp(SECOND, 4242), run_stamp(SECOND.replace(microsecond=999_999), 4243)
    assert a == "2025-01-31/14-03-59-4242" and b == "2025-01-31/14-03-59-4243"


def test_in_a_container_the_stamp_carries_the_host_name_and_a_random_tag(tmp_path):
    """Pods of two jobs started in the same second both run as pid 7 in their own pid
    namespace: their host names, and a random tag for containers that share the host's name
    (host networking), keep them apart. A container mounts its own /proc, so its NSpid shows
    one pid; its pid namespace link differs from the host's."""
    assert run_stamp(SECOND, 7, "trainer-7f9c-1a2b") == "2025-01-31/14-03-59-7-trainer-7f9c-1a2b"
    link = tmp_path / "pid"
    link.symlink_to(INIT_PID_NAMESPACE)  # the host's processes
    assert stamp_host(link) is None
    link.unlink()
    link.symlink_to("pid:[4026532179]")  # a container's (seen in `unshare --pid --mount-proc`)
    host = re.sub(r"[^A-Za-z0-9_-]", "_", socket.gethostname().split(".")[0]) or "container"
    tags = {stamp_host(link) for _ in range(8)}
    for tag in tags:
        assert tag is not None and re.fullmatch(re.escape(host) + r"-[0-9a-f]{4}", tag), tag
    assert len(tags) > 1  # drawn afresh per process (8 draws of 65,536 values)
    assert stamp_host(tmp_path / "missing") is None
    assert os.readlink("/proc/self/ns/pid").startswith("pid:[")  # what stamp_host reads here


def _hydra_config():
    return _app_config().hydra


def _app_config(*overrides: str):
    """dmt-train's config as its Hydra callbacks get it (with the ``hydra`` node)."""
    from hydra import compose, initialize_config_module  # noqa: PLC0415

    with initialize_config_module(CONF_MODULE, version_base="1.3"):
        return compose("config", overrides=list(overrides), return_hydra_config=True)


def test_the_default_run_and_sweep_directories_use_the_stamp():
    hydra = _hydra_config()
    # in a container (its own pid namespace) the host name and a random tag follow the pid
    pattern = r"\d{4}-\d\d-\d\d/\d\d-\d\d-\d\d-" + str(os.getpid())
    pattern += r"(-[A-Za-z0-9_-]+-[0-9a-f]{4})?" if stamp_host() else ""
    assert re.fullmatch("outputs/" + pattern, hydra.run.dir), hydra.run.dir
    assert re.fullmatch("multirun/" + pattern, hydra.sweep.dir), hydra.sweep.dir
    assert (
        OmegaConf.to_container(hydra.sweep)["subdir"] == "${hydra.job.num}"
    )  # points of one sweep: one directory each


def test_the_readme_names_the_default_directories_by_the_stamp():
    """Reproduced: the README's SLURM sweep example put its jobs in multirun/<date>/<time>/{0,1},
    a directory no run has: the stamp's pid follows the time (``run_stamp``)."""
    readme = (REPO / "README.md").read_text()
    named = re.findall(r"(?:outputs|multirun)/<date>/<time>[^/`\s]*", readme)
    assert named and set(named) == {"outputs/<date>/<time>-<pid>", "multirun/<date>/<time>-<pid>"}
    assert run_stamp(SECOND, 4242) == "2025-01-31/14-03-59-4242"  # <date>/<time>-<pid>


def test_the_ranks_of_a_job_adopt_the_first_ranks_stamp():
    server = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    ranks = [
        dist.TCPStore("127.0.0.1", server.port, is_master=False, wait_for_workers=False)
        for _ in range(3)
    ]
    stamps = [agreed_stamp(s, "job-a", run_stamp(SECOND, 100 + i)) for i, s in enumerate(ranks)]
    assert stamps == ["2025-01-31/14-03-59-100"] * 3
    assert agreed_stamp(ranks[0], "job-b", "other") == "other"  # another job, its own stamp


SRUN_TASK = {"SLURM_JOB_ID": "4321", "SLURM_STEP_ID": "2", "SLURM_NTASKS": "2",
             "SLURM_TASKS_PER_NODE": "1(x2)", "SLURM_JOB_NODELIST": "n[1-2]"}  # fmt: skip


def test_the_tasks_of_an_srun_step_share_one_directory(monkeypatch):
    """A reproduced bug: under plain ``srun dmt-train`` (no torchrun, so no store before the run
    directory) every task stamped its own default directory from its clock and pid, which left
    one directory of logs per rank, one sweep directory per rank with -m, and sent a requeued
    job to a new directory where ``trainer.resume_from=auto`` found nothing."""
    for key in (*TORCHRUN_VARS, "TORCHELASTIC_USE_AGENT_STORE"):
        monkeypatch.delenv(key, raising=False)
    for key in [k for k in os.environ if k.startswith("SLURM_")]:
        monkeypatch.delenv(key, raising=False)
    stamps = []
    for rank in (0, 1):
        task = {**SRUN_TASK, "SLURM_PROCID": str(rank), "SLURM_LOCALID": "0",
                "SLURM_NODEID": str(rank)}  # fmt: skip
        assert slurm_stamp(task) == "slurm/4321.2"
        for key, value in task.items():
            monkeypatch.setenv(key, value)
        stamps.append(_resolve_run_stamp())
    assert stamps == ["slurm/4321.2"] * 2
    # a multirun's later jobs resolve it again after init_runtime exported torchrun's variables
    # (RANK, WORLD_SIZE, MASTER_ADDR, ...) into the process: still the step's stamp
    from dmt.runtime import _export, _exported, world_from_env  # noqa: PLC0415

    saved = dict(_exported)
    _export(world_from_env(os.environ), os.environ)
    try:
        assert "RANK" in os.environ and _resolve_run_stamp() == "slurm/4321.2"
    finally:
        for key in TORCHRUN_VARS:
            os.environ.pop(key, None)
        _exported.clear()
        _exported.update(saved)
    # one task, or torchrun's world (its agent's store agrees on a stamp): the usual stamp
    one = {**SRUN_TASK, "SLURM_NTASKS": "1", "SLURM_TASKS_PER_NODE": "1", "SLURM_PROCID": "0",
           "SLURM_LOCALID": "0", "SLURM_NODEID": "0"}  # fmt: skip
    assert slurm_stamp(one) is None
    assert slurm_stamp({"RANK": "0", "WORLD_SIZE": "2", "LOCAL_RANK": "0",
                        "LOCAL_WORLD_SIZE": "2", "MASTER_ADDR": "h", "MASTER_PORT": "1"}) is None  # fmt: skip


def _outputs_error(run_dir) -> str:
    return (
        f"run directory {run_dir} already holds another run's outputs (metrics.json, checkpoints/); "
        "choose another hydra.run.dir (or leave it unset for a new one), or resume that run "
        f"with trainer.resume_from=auto or trainer.resume_from=<a checkpoint in {run_dir}>"
    )


def test_resume_auto_refused_over_a_finished_run_says_it_has_no_checkpoint(tmp_path):
    """Reproduced: ``trainer.resume_from=auto`` into the directory of a run that finished without
    a checkpoint was refused with "or resume that run with trainer.resume_from=auto", the very
    setting given."""
    run = tmp_path / "run"
    (run / "checkpoints" / "step_4").mkdir(parents=True)  # incomplete: no meta.json
    (run / "metrics.json").write_text("{}")
    with pytest.raises(ValueError) as e:
        check_outputs(run, resume_from="auto", checkpoint_dir="checkpoints")
    assert str(e.value) == (
        f"run directory {run} already holds another run's outputs (metrics.json, checkpoints/) "
        "and no complete checkpoint that trainer.resume_from=auto resumes; choose another "
        "hydra.run.dir (or leave it unset for a new one)"
    )


def test_a_directory_with_outputs_is_refused_unless_the_run_resumes_it(tmp_path):
    run = tmp_path / "run"
    check_outputs(run, resume_from=None, checkpoint_dir="checkpoints")  # absent: fine
    (run / "checkpoints" / "step_4").mkdir(parents=True)
    (run / "metrics.json").write_text("{}")
    (run / ".hydra").mkdir()  # Hydra's files and the log are not outputs
    with pytest.raises(ValueError) as e:
        check_outputs(run, resume_from=None, checkpoint_dir="checkpoints")
    assert str(e.value) == _outputs_error(run)
    with pytest.raises(
        ValueError, match="already holds another run's outputs"
    ):  # resumes another run
        check_outputs(
            run, resume_from=str(tmp_path / "other" / "checkpoints"), checkpoint_dir="checkpoints"
        )
    # auto resumes only a run that has a complete checkpoint (else it would start afresh over
    # this one's metrics.json)
    with pytest.raises(ValueError, match="already holds another run's outputs"):
        check_outputs(run, resume_from="auto", checkpoint_dir="checkpoints")
    (run / "checkpoints" / "step_4" / "meta.json").write_text('{"files": {}}')
    (run / "checkpoints" / "step_4" / ".metadata").write_bytes(b"")  # DCP's index
    check_outputs(run, resume_from="auto", checkpoint_dir="checkpoints")
    check_outputs(run, resume_from=str(run / "checkpoints"), checkpoint_dir="checkpoints")
    check_outputs(
        run, resume_from=str(run / "checkpoints" / "step_4"), checkpoint_dir="checkpoints"
    )
    # a checkpoint of another run through ".." is not this run's (a reproduced bug: it was,
    # and the run wrote over this one's metrics.json and history)
    other = str(run / ".." / "other" / "checkpoints" / "step_2")
    with pytest.raises(ValueError, match="already holds another run's outputs"):
        check_outputs(run, resume_from=other, checkpoint_dir="checkpoints")
    assert not resumes(run, other) and resumes(run, str(run / "x" / ".." / "checkpoints"))
    # checkpoints kept elsewhere are outputs of the run too
    (run / "metrics.json").unlink()
    check_outputs(run, resume_from=None, checkpoint_dir=str(tmp_path / "ckpt"))
    (tmp_path / "ckpt" / "step_1").mkdir(parents=True)
    with pytest.raises(ValueError, match=re.escape(f"outputs ({tmp_path / 'ckpt'}/)")):
        check_outputs(run, resume_from=None, checkpoint_dir=str(tmp_path / "ckpt"))


def test_a_checkpoint_in_the_runs_absolute_checkpoint_dir_resumes_the_run(tmp_path):
    """A reproduced bug: with an absolute ``trainer.checkpoint_dir`` (outside the run
    directory), ``trainer.resume_from`` set to that directory or to one of its ``step_N`` was
    refused as resuming another run, and told to name a checkpoint inside the run directory,
    which holds none; ``trainer.resume_from=auto`` resumed the very same checkpoint."""
    run, ckpt = tmp_path / "run", tmp_path / "ckpt"
    run.mkdir()
    (run / "metrics.json").write_text("{}")
    step = ckpt / "step_4"
    step.mkdir(parents=True)
    (step / "meta.json").write_text('{"files": {}}')
    (step / ".metadata").write_bytes(b"")  # DCP's index
    for resume_from in ("auto", str(ckpt), str(step), str(run / ".." / "ckpt" / "step_4")):
        assert resumes(run, resume_from, str(ckpt)), resume_from
        check_outputs(run, resume_from=resume_from, checkpoint_dir=str(ckpt))
    # a checkpoint beside it is still another run's
    other = str(ckpt / ".." / "other" / "step_4")
    assert not resumes(run, other, str(ckpt))
    with pytest.raises(ValueError, match="already holds another run's outputs"):
        check_outputs(run, resume_from=other, checkpoint_dir=str(ckpt))


def test_a_stopped_runs_history_is_an_output(tmp_path):
    """Reproduced bug: a run killed before its end and its first checkpoint left only
    ``history.jsonl`` (and its .hydra/ record), and a second run wrote over both without a
    word; an empty history (a run that failed before its first record) is no output."""
    run = tmp_path / "run"
    run.mkdir()
    (run / "history.jsonl").write_text("")
    check_outputs(run, resume_from=None, checkpoint_dir="checkpoints")
    (run / "history.jsonl").write_text('{"step": 50, "train/loss": 0.5}\n')
    assert outputs_of(run, "checkpoints") == ["history.jsonl"]
    with pytest.raises(ValueError, match=re.escape("another run's outputs (history.jsonl)")):
        check_outputs(run, resume_from=None, checkpoint_dir="checkpoints")
    check_outputs(run, resume_from="auto", checkpoint_dir="checkpoints")  # afresh, warned


@pytest.mark.parametrize(
    ("name", "made"),
    [
        ("curves.png", "drew there (no history.jsonl it was drawn from)"),
        ("sharding_plan.txt", "wrote there (no history.jsonl, which a run writes before its plan)"),
    ],
)
def test_a_users_own_curves_png_or_sharding_plan_is_never_replaced(tmp_path, name, made):
    """Reproduced bugs: a fresh run (or resume_from=auto, starting afresh) in a directory holding
    a curves.png or sharding_plan.txt of the user's own drew its curves (at its first
    validation) or wrote its plan over it. It is refused now, naming the file, which stays as it
    was; one beside a history.jsonl, which a run writes first (empty until its first record), is
    a run's, rewritten by its restart or resume."""
    run = tmp_path / "run"
    run.mkdir()
    (run / name).write_text("the user's own\n")
    for resume_from in (None, "auto"):
        with pytest.raises(ValueError) as e:
            check_outputs(run, resume_from=resume_from, checkpoint_dir="checkpoints")
        assert str(e.value) == (
            f"run directory {run} holds a {name} that no dmt run {made}: a run writes its own "
            f"{name} there, and dmt does not replace a file it did not make; choose another "
            f"hydra.run.dir (or leave it unset for a new one), or move that {name} away"
        )
    with pytest.raises(ValueError, match=f"holds a {re.escape(name)} that no dmt run"):
        claim_run_dir(run, resume_from=None, checkpoint_dir="checkpoints").__enter__()
    assert sorted(p.name for p in run.iterdir()) == [name] and not lock_held(run)
    assert (run / name).read_text() == "the user's own\n"
    (run / "history.jsonl").write_text("")  # a run stopped before its first record
    check_outputs(run, resume_from=None, checkpoint_dir="checkpoints")
    check_outputs(run, resume_from="auto", checkpoint_dir="checkpoints")
    (run / "history.jsonl").write_text('{"step": 50, "train/loss": 0.5}\n')
    with pytest.raises(ValueError, match=re.escape("another run's outputs (history.jsonl)")):
        check_outputs(run, resume_from=None, checkpoint_dir="checkpoints")
    check_outputs(run, resume_from="auto", checkpoint_dir="checkpoints")  # afresh, warned


@pytest.mark.parametrize("name", ["curves.png", "sharding_plan.txt"])
def test_a_sweep_job_refused_for_a_users_own_file_writes_no_record_there(tmp_path, name):
    """Reproduced: a multirun job whose directory held a user's own curves.png or
    sharding_plan.txt was refused by the job's claim (check_outputs) only after Hydra had
    written its .hydra/ record and log there: job_refused, which sends those elsewhere, did not
    look for such files. A run's own (beside its history.jsonl) is no reason to refuse."""
    job = tmp_path / "sweep" / "0"
    job.mkdir(parents=True)
    (job / name).write_text("the user's own\n")
    config = OmegaConf.create(
        {
            "hydra": {
                "mode": "MULTIRUN",
                "sweep": {"dir": str(tmp_path / "sweep")},
                "runtime": {"output_dir": str(job)},
            },
            "trainer": {"resume_from": None, "checkpoint_dir": "checkpoints"},
        }
    )
    assert job_refused(config)
    (job / "history.jsonl").write_text("")
    assert not job_refused(OmegaConf.create(OmegaConf.to_container(config)))  # a fresh cache


def test_a_resuming_sweep_stops_before_rewriting_jobs_it_would_not_resume(tmp_path):
    """Reproduced bug: a sweep with trainer.resume_from=auto into an earlier sweep's directory
    (jobs with metrics.json, no checkpoint) rewrote each job's .hydra/ record, then failed every
    job; the trials table then showed the earlier runs' metrics under the new settings."""
    sweep = tmp_path / "sweep"
    (sweep / "0").mkdir(parents=True)
    (sweep / "0" / "metrics.json").write_text("{}")
    config = OmegaConf.create(
        {
            "hydra": {"sweep": {"dir": str(sweep), "subdir": "${hydra.job.num}"}},
            "trainer": {"resume_from": "auto", "checkpoint_dir": "checkpoints"},
        }
    )
    with pytest.raises(SystemExit) as refused:
        RunDirGuard().on_multirun_start(config)
    assert str(refused.value) == (
        f"Error: sweep directory {sweep}: job directory {sweep / '0'} holds another run's outputs "
        "(metrics.json) and no checkpoint that trainer.resume_from=auto resumes; choose another "
        "hydra.sweep.dir (or leave it unset for a new one)"
    )
    step = sweep / "0" / "checkpoints" / "step_2"  # a complete checkpoint: the job resumes it
    step.mkdir(parents=True)
    (step / "meta.json").write_text('{"files": {}}')
    (step / ".metadata").write_bytes(b"")
    RunDirGuard().on_multirun_start(config)


def test_a_requeued_slurm_job_is_told_to_resume(tmp_path, monkeypatch):
    """A SLURM job requeued after preemption runs again in its own run directory: the refusal
    says so, and how to resume (check 3 of scripts/slurm_acceptance.sh runs the resuming case)."""
    run = tmp_path / "run"
    (run / "checkpoints" / "step_4").mkdir(parents=True)
    (run / "checkpoints" / "step_4" / "shard.distcp").write_text("")
    # stopped while it wrote its first checkpoint: auto starts afresh, nothing complete to lose
    check_outputs(run, resume_from="auto", checkpoint_dir="checkpoints")
    (run / "checkpoints" / "step_4" / "meta.json").write_text('{"files": {}}')
    (run / "checkpoints" / "step_4" / ".metadata").write_bytes(b"")  # DCP's index
    monkeypatch.setenv("SLURM_RESTART_COUNT", "0")
    with pytest.raises(ValueError) as e:
        check_outputs(run, resume_from=None, checkpoint_dir="checkpoints")
    assert "SLURM" not in str(e.value)
    monkeypatch.setenv("SLURM_RESTART_COUNT", "2")
    with pytest.raises(ValueError) as e:
        check_outputs(run, resume_from=None, checkpoint_dir="checkpoints")
    assert str(e.value) == (
        f"run directory {run} already holds another run's outputs (checkpoints/) (this SLURM job "
        "was requeued, SLURM_RESTART_COUNT=2: they are probably its own earlier attempt's; set "
        "trainer.resume_from=auto and trainer.checkpoint_every for jobs that may be preempted); "
        "choose another hydra.run.dir (or leave it unset for a new one), or resume that run with "
        f"trainer.resume_from=auto or trainer.resume_from=<a checkpoint in {run}>"
    )
    check_outputs(run, resume_from="auto", checkpoint_dir="checkpoints")


# An salloc shell (and an sbatch script) of a job of 2 nodes x 2 tasks, outside any step, as
# SLURM 22.05 gives it (recorded on a local cluster like scripts/slurm_smoke.sh's).
SALLOC_SHELL = {"SLURM_JOB_ID": "8", "SLURM_JOBID": "8", "SLURM_NTASKS": "4", "SLURM_NPROCS": "4",
                "SLURM_NNODES": "2", "SLURM_JOB_NUM_NODES": "2", "SLURM_NTASKS_PER_NODE": "2",
                "SLURM_TASKS_PER_NODE": "2(x2)", "SLURM_JOB_CPUS_PER_NODE": "2(x2)",
                "SLURM_JOB_NODELIST": "cpu5,gpu001", "SLURM_NODELIST": "cpu5,gpu001"}  # fmt: skip


def test_a_slurm_launcher_sweep_is_submitted_from_inside_an_allocation(tmp_path, monkeypatch):
    """Reproduced bug: ``dmt-train -m hydra/launcher=slurm`` started in an allocation of several
    tasks (an ``salloc -N2 --ntasks-per-node=2`` shell, an sbatch script) stopped before it
    submitted anything: "this process is one of 4 SLURM tasks but would train as a world of one
    (...); start one dmt process per task in a job step (srun, or hydra/launcher=slurm)". The
    process that submits the sweep's jobs trains in none of them; each job is a SLURM job of
    its own, whose tasks form its world. A multirun whose jobs run in this process (Hydra's
    basic launcher) is still refused there."""
    from hydra import compose, initialize_config_module  # noqa: PLC0415

    for key in (*TORCHRUN_VARS, "TORCHELASTIC_USE_AGENT_STORE"):
        monkeypatch.delenv(key, raising=False)
    for key in [k for k in os.environ if k.startswith("SLURM_")]:
        monkeypatch.delenv(key, raising=False)
    for key, value in SALLOC_SHELL.items():
        monkeypatch.setenv(key, value)
    sweep = tmp_path / "sweep"
    with initialize_config_module(CONF_MODULE, version_base="1.3"):
        config = compose(
            "config",
            overrides=["hydra/launcher=slurm", f"hydra.sweep.dir={sweep}"],
            return_hydra_config=True,
        )
    guard = RunDirGuard()
    guard.on_multirun_start(config)  # submits: the sweep directory is this process's
    assert guard.lock is not None and guard.lock.run_dir == sweep and (sweep / LOCK_FILE).is_file()
    guard.on_multirun_end(config)
    assert guard.lock is None
    with initialize_config_module(CONF_MODULE, version_base="1.3"):
        basic = compose("config", overrides=[f"hydra.sweep.dir={sweep}"], return_hydra_config=True)
    with pytest.raises(SystemExit) as refused:
        RunDirGuard().on_multirun_start(basic)
    assert str(refused.value).startswith(
        "Error: this process is one of 4 SLURM tasks but would train as a world of one ("
    )


HOLD = (
    "import sys, pathlib; from dmt.run_dir import lock_run_dir; "
    "lock_run_dir(pathlib.Path(sys.argv[1])); print('locked', flush=True); sys.stdin.read()"
)


def test_a_held_lock_refuses_a_second_run_and_a_killed_holder_leaves_none(tmp_path):
    run = tmp_path / "run"
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLD, str(run)],
        cwd=REPO,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env=dict(os.environ, PYTHONPATH=str(REPO)),
    )
    try:
        assert holder.stdout.readline() == "locked\n"
        expected = f"run directory {run} is in use by another run (pid {holder.pid} on host {socket.gethostname()}, started "
        with pytest.raises(ValueError) as e:
            lock_run_dir(run)
        assert str(e.value).startswith(expected), str(e.value)
        assert str(e.value).endswith(
            "); choose another hydra.run.dir, or wait until that run has ended"
        )
        with (
            pytest.raises(ValueError, match="is in use by another run"),
            claim_run_dir(run, resume_from="auto", checkpoint_dir="checkpoints"),
        ):
            pass
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait()
    assert (run / LOCK_FILE).exists()  # the file stays, the lock went with the process
    with claim_run_dir(run, resume_from=None, checkpoint_dir="checkpoints"):
        lock, taken = lock_run_dir(run)  # the same process holds it: reentrant
        assert not taken and f"pid={os.getpid()} " in (run / LOCK_FILE).read_text()
    lock, taken = lock_run_dir(run)  # released at the end of the claim
    assert taken
    lock.release()


@pytest.mark.parametrize("kind", ["run", "sweep"])
@pytest.mark.parametrize("inside", [False, True])
def test_a_directory_where_a_file_is_is_named_not_a_traceback(tmp_path, kind, inside):
    """A reproduced bug: the lock's directory made where a file is raised NotADirectoryError
    (or FileExistsError), which Hydra turns into a warning before failing with a traceback; and
    claim_run_dir raised it on rank 0 only, past the verdict the other ranks wait for."""
    notes = tmp_path / "notes.txt"
    notes.write_text("my notes\n")
    target = notes / "run" if inside else notes
    expected = (
        f"{kind} directory {target}: {notes} is not a directory; choose another hydra.{kind}.dir"
    )
    with pytest.raises(ValueError) as e:
        lock_run_dir(target, kind=kind)
    assert str(e.value) == expected
    if kind == "run":
        with (
            pytest.raises(ValueError) as e,
            claim_run_dir(target, resume_from=None, checkpoint_dir="checkpoints"),
        ):
            pass
        assert str(e.value) == expected
    assert notes.read_text() == "my notes\n"


@pytest.mark.parametrize(
    ("env", "rank"),
    [
        ({}, 0),
        ({"RANK": "3", "WORLD_SIZE": "4", "MASTER_ADDR": "h", "MASTER_PORT": "1"}, 3),
        # a task of an srun step: RANK is not set yet when Hydra's callback runs
        (
            {
                "SLURM_JOB_ID": "7",
                "SLURM_STEP_ID": "0",
                "SLURM_PROCID": "1",
                "SLURM_NTASKS": "2",
                "SLURM_STEP_NUM_TASKS": "2",
                "SLURM_LOCALID": "1",
                "SLURM_NODEID": "0",
                "SLURM_STEP_TASKS_PER_NODE": "2",
                "SLURM_STEP_NODELIST": "n1",
                "SLURM_JOB_NODELIST": "n1",
            },
            1,
        ),
    ],
)
def test_the_callback_knows_its_rank_from_the_launcher(monkeypatch, env, rank):
    for key in list(os.environ):
        if key.startswith(("SLURM_", "TORCHELASTIC_")) or key in TORCHRUN_VARS:
            monkeypatch.delenv(key)
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    assert launch_rank() == rank
    # each rank logs to its own file: train.log for rank 0, train.rank<r>.log for the others
    handler = OmegaConf.to_container(_hydra_config().job_logging.handlers.file)
    assert handler["filename"].endswith("/${hydra.job.name}${dmt.rank_log_suffix:}.log}")
    assert rank_log_suffix() == ("" if rank == 0 else f".rank{rank}")
    # the console's lines of a world of several name the rank (rank 0's too); a world of one's
    # are as they were
    console = _hydra_config().job_logging.formatters.console.format
    tag = f"[rank{rank}]" if env else ""
    assert console == tag + "[%(asctime)s][%(name)s][%(levelname)s] - %(message)s"


def test_a_warning_in_a_job_is_a_line_of_its_log_that_names_the_rank(monkeypatch, caplog):
    """A Python warning (``warnings.warn``: dmt's, torch's, TorchRec's) went to stderr as
    Python prints it, past the job's log: in the console of a job of 64 ranks nothing said
    whose it was, and no rank's log file kept it. Now, while the job runs, it is a record of
    ``py.warnings`` through the job's handlers (the console's line names the rank), once per
    place as before; ``pytest.warns`` still records its own, and after the job warnings print
    as Python prints them."""
    for key in list(os.environ):
        if key.startswith(("SLURM_", "TORCHELASTIC_")) or key in TORCHRUN_VARS:
            monkeypatch.delenv(key)
    rank_1_of_2 = {"RANK": "1", "WORLD_SIZE": "2", "MASTER_ADDR": "h", "MASTER_PORT": "1"}
    for key, value in rank_1_of_2.items():
        monkeypatch.setenv(key, value)
    config = _app_config()
    caplog.set_level(logging.WARNING, logger="py.warnings")  # whatever an earlier test set
    console = logging.StreamHandler(io.StringIO())
    console.setFormatter(logging.Formatter(config.hydra.job_logging.formatters.console.format))
    root, job = logging.getLogger(), instantiate(config.hydra.callbacks.warnings)
    assert isinstance(job, WarningsToLog)  # dmt-train's callback
    root.addHandler(console)
    try:
        with warnings.catch_warnings(record=True) as printed:  # what Python prints (stderr)
            warnings.simplefilter("default")
            job.on_job_start(config, task_function=None)
            with pytest.warns(UserWarning, match="^a test's$"):
                warnings.warn("a test's", UserWarning, stacklevel=1)
            for _ in range(2):
                warnings.warn("the model diverged", RuntimeWarning, stacklevel=1)
            job.on_job_end(config, job_return=None)
            warnings.warn("after the job", UserWarning, stacklevel=1)
    finally:
        root.removeHandler(console)
    assert [str(w.message) for w in printed] == ["after the job"]
    logged = console.stream.getvalue()
    assert re.fullmatch(
        r"\[rank1\]\[[-\d :,]+\]\[py\.warnings\]\[WARNING\] - "
        + re.escape(f"{__file__}:")
        + r"\d+: RuntimeWarning: the model diverged\n"
        + re.escape('  warnings.warn("the model diverged", RuntimeWarning, stacklevel=1)\n\n'),
        logged,
    ), logged


def test_under_another_job_logging_config_a_warning_prints_as_python_prints_it():
    """``hydra/job_logging=disabled`` has no handlers: a warning made a log record there
    would be lost; it prints to stderr as Python prints it."""
    config = _app_config("hydra/job_logging=disabled")
    job = WarningsToLog()
    with warnings.catch_warnings(record=True) as printed:
        warnings.simplefilter("default")
        job.on_job_start(config, task_function=None)
        warnings.warn("the model diverged", RuntimeWarning, stacklevel=1)
        job.on_job_end(config, job_return=None)
    assert [str(w.message) for w in printed] == ["the model diverged"]


def test_a_capture_that_the_caller_set_up_outlives_the_job():
    """Reviewed: the job turned off at its end a capture of warnings that whoever called the
    app had set up before it (``logging.captureWarnings(True)`` again changes nothing)."""
    config = _app_config()
    job = WarningsToLog()
    logging.captureWarnings(True)
    try:
        captured = warnings.showwarning
        job.on_job_start(config, task_function=None)
        job.on_job_end(config, job_return=None)
        assert warnings.showwarning is captured
    finally:
        logging.captureWarnings(False)


HOLD_FOR = (  # holds the lock, then marks its end (<run>.held) just before it exits
    "import sys, time, pathlib; from dmt.run_dir import lock_run_dir; "
    "run = pathlib.Path(sys.argv[1]); lock_run_dir(run); print('locked', flush=True); "
    "time.sleep(float(sys.argv[2])); run.with_suffix('.held').touch()"
)
_JOB_VARS = (
    "SLURM_JOB_ID",
    "SLURM_RESTART_COUNT",
    "TORCHELASTIC_RUN_ID",
    "TORCHELASTIC_RESTART_COUNT",
)


@pytest.fixture(autouse=True)
def _first_attempt(monkeypatch):
    """Every test here starts as a first attempt, even when the suite runs in a requeued job."""
    for var in _JOB_VARS:
        monkeypatch.delenv(var, raising=False)


def _hold(run, env: dict[str, str], seconds: float) -> subprocess.Popen:
    return _holder(HOLD_FOR, [str(run), str(seconds)], env)


def _holder(script: str, args: list[str], env: dict[str, str]) -> subprocess.Popen:
    """A process running ``script`` that has printed "locked"."""
    base = {k: v for k, v in os.environ.items() if k not in _JOB_VARS}
    holder = subprocess.Popen(
        [sys.executable, "-c", script, *args],
        cwd=REPO,
        stdout=subprocess.PIPE,
        text=True,
        env=dict(base, PYTHONPATH=str(REPO), **env),
    )
    assert holder.stdout.readline() == "locked\n"
    return holder


def test_another_processs_lock_is_seen_without_taking_it(tmp_path, monkeypatch):
    """What a multirun job's log and record go by, before its claim (a live run in its
    directory): another process's lock, left held; not this process's own, nor an earlier
    attempt of this job's (which the claim waits for), nor none."""
    run = tmp_path / "run"
    assert not held_by_another(run) and not run.exists()  # nothing made to look
    holder = _hold(run, {"SLURM_JOB_ID": "77"}, 60)
    try:
        assert held_by_another(run)
        with pytest.raises(ValueError, match="is in use by another run"):
            lock_run_dir(run)  # the look took nothing from the holder
        monkeypatch.setenv("SLURM_JOB_ID", "77")
        monkeypatch.setenv("SLURM_RESTART_COUNT", "1")
        assert not held_by_another(run)
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait()
    monkeypatch.delenv("SLURM_RESTART_COUNT")
    assert not held_by_another(run)
    lock, taken = lock_run_dir(run)
    assert taken and not held_by_another(run)
    lock.release()


@pytest.mark.parametrize(
    ("holder_env", "our_env", "waits"),
    [
        # a requeued sbatch job: same SLURM_JOB_ID, whatever run id torchrun --standalone drew
        (
            {"SLURM_JOB_ID": "77", "TORCHELASTIC_RUN_ID": "uuid-a"},
            {"SLURM_JOB_ID": "77", "SLURM_RESTART_COUNT": "1", "TORCHELASTIC_RUN_ID": "uuid-b"},
            "SLURM job 77, SLURM_RESTART_COUNT=1",
        ),
        # a torchelastic restart keeps its run id
        (
            {"TORCHELASTIC_RUN_ID": "job-5"},
            {"TORCHELASTIC_RUN_ID": "job-5", "TORCHELASTIC_RESTART_COUNT": "2"},
            "torchelastic run job-5, TORCHELASTIC_RESTART_COUNT=2",
        ),
        # a second run of the same allocation: not a restart
        ({"SLURM_JOB_ID": "77"}, {"SLURM_JOB_ID": "77"}, None),
        # a requeued job, another job's lock
        ({"SLURM_JOB_ID": "78"}, {"SLURM_JOB_ID": "77", "SLURM_RESTART_COUNT": "1"}, None),
        # torchrun's default run id "none" is every such job's: not a sign of the same job
        (
            {"TORCHELASTIC_RUN_ID": "none"},
            {"TORCHELASTIC_RUN_ID": "none", "TORCHELASTIC_RESTART_COUNT": "1"},
            None,
        ),
    ],
    ids=["slurm-requeue", "elastic-restart", "not-a-restart", "other-job", "elastic-none"],
)
def test_a_restarted_job_waits_for_its_earlier_attempts_lock(
    tmp_path, monkeypatch, caplog, holder_env, our_env, waits
):
    """On NFS a host that died keeps its lock until the file server's lease ends: a restart of
    the holder's own job waits for it instead of failing; anything else is refused at once."""
    for var, value in our_env.items():
        monkeypatch.setenv(var, value)
    run = tmp_path / "run"
    # a holder that lets go after 1.5 s for a restart to wait for; a lasting one otherwise
    holder = _hold(run, holder_env, seconds=1.5 if waits else 300)
    try:
        if waits:
            with caplog.at_level(logging.WARNING, logger="dmt.run_dir"):
                lock, taken = lock_run_dir(run, stale_wait_s=60)
            # taken only once the holder let go, at its end: it waited for it
            assert taken and run.with_suffix(".held").exists()
            assert holder.wait(timeout=30) == 0
            lock.release()
            assert (
                f"run directory {run} is locked by an earlier attempt of this job (pid "
                f"{holder.pid} on host {socket.gethostname()}, started "
            ) in caplog.text
            assert f"; this is {waits}), probably on a host that died" in caplog.text
        else:
            # refused at once: a wait would end in another message ("still locked after")
            with pytest.raises(ValueError, match="; choose another hydra.run.dir, or wait"):
                lock_run_dir(run, stale_wait_s=60)
            assert holder.poll() is None
    finally:
        holder.kill()
        holder.wait()


def test_a_restart_that_waits_in_vain_says_why(tmp_path, monkeypatch):
    monkeypatch.setenv("SLURM_JOB_ID", "77")
    monkeypatch.setenv("SLURM_RESTART_COUNT", "2")
    run = tmp_path / "run"
    holder = _hold(run, {"SLURM_JOB_ID": "77"}, seconds=120)
    try:
        with pytest.raises(ValueError) as e:
            lock_run_dir(run, stale_wait_s=3)
    finally:
        holder.kill()
        holder.wait()
    assert str(e.value).startswith(
        f"run directory {run} is in use by another run (pid {holder.pid} on host "
        f"{socket.gethostname()}, started "
    )
    assert str(e.value).endswith(
        "), an earlier attempt of this job (SLURM job 77, SLURM_RESTART_COUNT=2), still locked "
        "after 3.0 s: if its host died, the file server keeps its lock until the host's lease "
        "ends (NFSv4) or the host comes back or an administrator clears it (NFSv3); if it is "
        "alive, stop it; choose another hydra.run.dir, or wait until that run has ended"
    )


HOLD_CHECKPOINTS = (  # claims a run writing into a checkpoint directory, for a while
    "import sys, time, pathlib; from dmt.run_dir import claim; "
    "run = pathlib.Path(sys.argv[1]); claim(run, resume_from=None, checkpoint_dir=sys.argv[2]); "
    "print('locked', flush=True); time.sleep(float(sys.argv[3])); run.with_suffix('.held').touch()"
)


def _hold_checkpoints(run, ckpt, env: dict[str, str], seconds: float) -> subprocess.Popen:
    return _holder(HOLD_CHECKPOINTS, [str(run), str(ckpt), str(seconds)], env)


def _complete_checkpoint(step) -> None:
    step.mkdir(parents=True)
    (step / "meta.json").write_text('{"files": {}}')
    (step / ".metadata").write_bytes(b"")  # DCP's index


def _claims_to_read(run: Path, ckpt: Path) -> None:
    """A run in ``run`` that writes no checkpoint into ``ckpt``, only reads them
    (``resume_from=auto``), claims its run directory."""
    with claim_run_dir(run, resume_from="auto", checkpoint_dir=str(ckpt), writes_checkpoints=False):
        assert lock_held(run)


def test_a_live_run_holds_its_checkpoint_dir_outside_its_run_dir(tmp_path):
    """Reproduced: two runs with their own run directories and one absolute
    trainer.checkpoint_dir, started together, both started (the directory was empty); one
    failed at its first save ("checkpoint .../step_5 exists already"), and a save could move
    the other's unfinished step_N aside as incomplete. The second is refused at start, naming
    the setting, the directory and its holder, before it makes anything."""
    ckpt = tmp_path / "ckpt"
    holder = _hold_checkpoints(tmp_path / "a", ckpt, {}, 300)
    try:
        record = (ckpt / LOCK_FILE).read_text()
        started = dict(f.split("=", 1) for f in record.split())["started"]
        expected = (
            f"trainer.checkpoint_dir={ckpt} is in use by another run (pid {holder.pid} on host "
            f"{socket.gethostname()}, started {started}); choose another trainer.checkpoint_dir, "
            "or wait until that run has ended"
        )
        for checkpoint_dir in (str(ckpt), "../ckpt"):  # absolute, or out of the run directory
            for resume_from in (None, "auto"):
                with pytest.raises(ValueError) as e:
                    claim(tmp_path / "b", resume_from=resume_from, checkpoint_dir=checkpoint_dir)
                assert str(e.value) == expected
        with (
            pytest.raises(ValueError) as e,
            claim_run_dir(tmp_path / "b", resume_from=None, checkpoint_dir=str(ckpt)),
        ):
            pass
        assert str(e.value) == expected
        assert not (tmp_path / "b").exists()  # refused before it made anything
        assert (ckpt / LOCK_FILE).read_text() == record and sorted(ckpt.iterdir()) == [
            ckpt / LOCK_FILE
        ]
        _claims_to_read(tmp_path / "c", ckpt)  # not held by a run that only reads them
    finally:
        holder.kill()
        holder.wait()
    # the lock went with its holder; its file is not a checkpoint (no output of a run there)
    assert outputs_of(tmp_path / "b", str(ckpt)) == []
    with claim_run_dir(tmp_path / "b", resume_from=None, checkpoint_dir=str(ckpt)):
        assert lock_held(ckpt) and f"pid={os.getpid()} " in (ckpt / LOCK_FILE).read_text()
        _complete_checkpoint(ckpt / "step_2")  # as this run saves it
    assert not lock_held(ckpt)  # released with the run directory's lock
    # a later run there: as before, refused for the checkpoints unless it resumes them
    with (
        pytest.raises(ValueError) as e,
        claim_run_dir(tmp_path / "d", resume_from=None, checkpoint_dir=str(ckpt)),
    ):
        pass
    assert str(e.value).startswith(
        f"run directory {tmp_path / 'd'} already holds another run's outputs ({ckpt}/); "
    )
    with claim_run_dir(tmp_path / "d", resume_from="auto", checkpoint_dir=str(ckpt)):
        assert lock_held(ckpt) and lock_held(tmp_path / "d")


HOLD_SWEEP = (  # holds a sweep directory's lock, as a multirun's submitting process does
    "import sys, time, pathlib; from dmt.run_dir import lock_run_dir; "
    "lock_run_dir(pathlib.Path(sys.argv[1]), kind='sweep'); print('locked', flush=True); "
    "time.sleep(float(sys.argv[2]))"
)


def _started(directory) -> str:
    return dict(f.split("=", 1) for f in (directory / LOCK_FILE).read_text().split())["started"]


def test_a_live_runs_directory_under_another_name_is_not_a_checkpoint_dir(tmp_path):
    """Reproduced: run a (checkpoints in its run directory, under a's lock) and run b with
    trainer.checkpoint_dir=<a>/checkpoints both started, b holding a lock of its own in a's
    checkpoint directory; so did a run whose run directory held a live run's outside checkpoint
    directory as its own. Both wrote one checkpoint directory. The second is refused at start,
    naming the directory and its holder, before it makes anything; once the first has ended, as
    before. A sweep's lock keeps no job's checkpoints out of its directory."""
    a, ckpt = tmp_path / "a", tmp_path / "a" / "checkpoints"
    holder = _hold_checkpoints(a, "checkpoints", {}, 300)
    try:
        expected = (
            f"trainer.checkpoint_dir={ckpt} is inside run directory {a}, in use by another run "
            f"(pid {holder.pid} on host {socket.gethostname()}, started {_started(a)}); choose "
            "another trainer.checkpoint_dir, or wait until that run has ended"
        )
        for checkpoint_dir in (str(ckpt), "../a/checkpoints", str(ckpt / "sub")):
            with pytest.raises(ValueError) as e:
                claim(tmp_path / "b", resume_from=None, checkpoint_dir=checkpoint_dir)
            named = os.path.normpath(tmp_path / "b" / checkpoint_dir)
            assert str(e.value) == expected.replace(str(ckpt), named, 1)
        assert not (tmp_path / "b").exists() and not ckpt.exists()
        _claims_to_read(tmp_path / "c", ckpt)  # not refused to a run that only reads them
    finally:
        holder.kill()
        holder.wait()
    with claim_run_dir(tmp_path / "b", resume_from=None, checkpoint_dir=str(ckpt)):
        assert lock_held(ckpt)  # as before: its own lock there, a's run has ended
    # the other way round: a live run's outside checkpoint directory, in this run's directory
    x = tmp_path / "x"
    holder = _hold_checkpoints(tmp_path / "d", x / "checkpoints", {}, 300)
    try:
        for checkpoint_dir, inside in (("checkpoints", ""), ("checkpoints/sub", "/sub")):
            with pytest.raises(ValueError) as e:
                claim(x, resume_from=None, checkpoint_dir=checkpoint_dir)
            where = (
                "is in use by another run"
                if not inside
                else f"is inside checkpoint directory {x / 'checkpoints'}, in use by another run"
            )
            assert str(e.value) == (
                f"trainer.checkpoint_dir={x / 'checkpoints'}{inside} {where} (pid {holder.pid} "
                f"on host {socket.gethostname()}, started {_started(x / 'checkpoints')}); choose "
                "another trainer.checkpoint_dir, or wait until that run has ended"
            )
        assert sorted(x.iterdir()) == [x / "checkpoints"]
        assert sorted((x / "checkpoints").iterdir()) == [x / "checkpoints" / LOCK_FILE]
    finally:
        holder.kill()
        holder.wait()
    with claim_run_dir(x, resume_from=None, checkpoint_dir="checkpoints"):
        assert lock_held(x)
    sweep = tmp_path / "sweep"
    holder = _holder(HOLD_SWEEP, [str(sweep), "300"], {})
    try:
        with claim_run_dir(sweep / "0", resume_from=None, checkpoint_dir=str(sweep / "ckpt_0")):
            assert lock_held(sweep / "ckpt_0")
    finally:
        holder.kill()
        holder.wait()


def test_a_run_inside_a_live_runs_directory_is_refused_its_checkpoint_dir(tmp_path):
    """Reproduced: run a (trainer.checkpoint_dir=sub/ckpt, under a's lock only) and run b in
    <a>/sub (trainer.checkpoint_dir=ckpt) both started: the check looked only below b's run
    directory, and both wrote one checkpoint directory. b is refused, naming a's lock, before it
    makes anything; a's lock does not say where a checkpoints, so any checkpoint directory of b's
    in a's directory is. One outside a's directory is not: b's own outputs (metrics.json, ...)
    share no name with a checkpoint's step_N."""
    a = tmp_path / "a"
    holder = _hold_checkpoints(a, "sub/ckpt", {}, 300)
    try:
        for checkpoint_dir in ("ckpt", "checkpoints"):
            with pytest.raises(ValueError) as e:
                claim(a / "sub", resume_from=None, checkpoint_dir=checkpoint_dir)
            assert str(e.value) == (
                f"trainer.checkpoint_dir={a / 'sub' / checkpoint_dir} is inside run directory {a}, "
                f"in use by another run (pid {holder.pid} on host {socket.gethostname()}, started "
                f"{_started(a)}); choose another hydra.run.dir or trainer.checkpoint_dir, or wait "
                "until that run has ended"
            )
        assert sorted(a.iterdir()) == [a / LOCK_FILE]
        with claim_run_dir(a / "sub", resume_from=None, checkpoint_dir=str(tmp_path / "ckpt_b")):
            assert lock_held(a / "sub") and lock_held(tmp_path / "ckpt_b")
    finally:
        holder.kill()
        holder.wait()
    with claim_run_dir(a / "sub", resume_from=None, checkpoint_dir="ckpt"):
        assert lock_held(a / "sub")  # as before: a's run has ended


def test_two_runs_started_together_never_both_hold_one_checkpoint_dir(tmp_path, monkeypatch):
    """Reproduced: the check for a checkpoint directory that is a live run's under another name
    ran before the run's locks were taken; run b (trainer.checkpoint_dir=<a>/checkpoints) that
    passed it while run a had not yet started, then locked after a had claimed its directory
    (whose check had found no lock of b's), held its claim beside a's: both wrote one checkpoint
    directory. Run a starts here between b's check and b's locks: b is refused, naming a."""
    import dmt.run_dir  # noqa: PLC0415

    a, ckpt = tmp_path / "a", tmp_path / "a" / "checkpoints"
    started: list[subprocess.Popen] = []
    outside = dmt.run_dir.checkpoint_dir_outside  # called after the check, before the locks

    def a_starts(*args, **kwargs):
        if not started:
            started.append(_hold_checkpoints(a, "checkpoints", {}, 300))
        return outside(*args, **kwargs)

    monkeypatch.setattr(dmt.run_dir, "checkpoint_dir_outside", a_starts)
    try:
        with pytest.raises(ValueError) as e:
            claim(tmp_path / "b", resume_from=None, checkpoint_dir=str(ckpt))
        assert str(e.value) == (
            f"trainer.checkpoint_dir={ckpt} is inside run directory {a}, in use by another run "
            f"(pid {started[0].pid} on host {socket.gethostname()}, started {_started(a)}); "
            "choose another trainer.checkpoint_dir, or wait until that run has ended"
        )
        assert not lock_held(tmp_path / "b") and not lock_held(ckpt)  # b's locks released
    finally:
        for holder in started:
            holder.kill()
            holder.wait()


def test_a_restart_waits_for_its_earlier_attempts_checkpoint_dir(tmp_path, monkeypatch):
    """A requeued SLURM job whose earlier attempt's host died: its checkpoint directory outside
    its run directory stays locked on NFS until the lease ends, as its run directory does; the
    restart waits for both (one wait), and takes them."""
    monkeypatch.setenv("SLURM_JOB_ID", "77")
    monkeypatch.setenv("SLURM_RESTART_COUNT", "1")
    run, ckpt = tmp_path / "run", tmp_path / "ckpt"
    holder = _hold_checkpoints(run, ckpt, {"SLURM_JOB_ID": "77"}, seconds=1.5)
    try:
        lock, taken = claim(run, resume_from="auto", checkpoint_dir=str(ckpt), stale_wait_s=60)
        assert taken and run.with_suffix(".held").exists()  # once the earlier attempt ended
        assert holder.wait(timeout=30) == 0
        assert lock_held(ckpt) and f"pid={os.getpid()} " in (ckpt / LOCK_FILE).read_text()
        lock.release()
        assert not lock_held(ckpt) and not lock_held(run)
    finally:
        holder.kill()
        holder.wait()


def test_a_rank_that_cannot_reach_rank_0s_store_stops_naming_it(monkeypatch):
    """A reproduced bug: when rank 0 never served the store (it died at start), another rank's
    connect failed in the run directory's callback with a bare ``DistNetworkError``, which Hydra
    turns into a warning and runs the job anyway: the rank waited as long again in the runtime's
    rendezvous (79 s in all at trainer.collective_timeout_s=20, 41 s now) and its error named
    neither rank 0 nor the setting. Now the callback stops it with one line saying so."""
    for key in list(os.environ):
        if key.startswith(("SLURM_", "TORCHELASTIC_")) or key in TORCHRUN_VARS:
            monkeypatch.delenv(key)
    port = free_port()  # nothing listens there: rank 0 never came
    env = {"RANK": "1", "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)}
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    with pytest.raises(SystemExit) as stopped:
        RunDirGuard()._hold(lambda: pytest.fail("only rank 0 takes the directory"), 1.0)
    assert str(stopped.value).startswith(
        f"Error: rank 1 cannot reach the job's store at 127.0.0.1:{port} (MASTER_ADDR:MASTER_PORT; "
        "rank 0 serves it under srun and in a world set by hand, torchrun's agent otherwise) "
        "within trainer.collective_timeout_s=1 s ("
    ), stopped.value


def test_row_wise_tables_too_few_for_the_launchers_ranks_are_refused_before_the_run(
    tmp_path, monkeypatch, capsys
):
    """Reproduced: a row-wise SPTT table of fewer rows than the ``K*L`` ranks of a tower whose
    ``L`` only the launcher gives (LOCAL_WORLD_SIZE) was refused by dmt.train.train on every
    rank, each with Hydra's traceback, after Hydra had written the run's directory. The guard
    refuses it with the other settings: once, by rank 0, exiting 1, no directory written."""
    from hydra import compose, initialize_config_module  # noqa: PLC0415

    for key in list(os.environ):
        if key.startswith(("SLURM_", "TORCHELASTIC_")) or key in TORCHRUN_VARS:
            monkeypatch.delenv(key)
    env = {"RANK": "0", "WORLD_SIZE": "2", "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "2",
           "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port())}  # fmt: skip
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    run = tmp_path / "run"
    rows = ["sptt=on", "+partition=naive", "model.partition.num_towers=2",
            "sptt.sharding_type=row_wise", "data.synthetic.cardinality=1"]  # fmt: skip
    with initialize_config_module(CONF_MODULE, version_base="1.3"):
        config = compose(
            "config",
            overrides=[*rows, "trainer.collective_timeout_s=1", f"hydra.run.dir={run}"],
            return_hydra_config=True,
        )
    guard = RunDirGuard()
    try:
        with pytest.raises(SystemExit) as refused:  # rank 1 never reads the verdict: 1 s
            guard.on_run_start(config)
    finally:
        guard.on_run_end(config)
    assert refused.value.code == 1
    assert capsys.readouterr().err == (
        "Error: sptt.sharding_type=row_wise puts a row block of every table on each of the K*L=2 "
        "ranks of its tower (sptt.hosts_per_tower=1, L=2 ranks per host (LOCAL_WORLD_SIZE)), but "
        "the table of feature cat_0 has 1 row (data.synthetic.cardinality=1): a row-wise table "
        "needs at least 2 rows; give it more, or use sptt.sharding_type=table_wise or "
        "column_wise\n"
    )
    assert not run.exists()


def test_the_wait_leaves_the_other_ranks_time():
    """The other ranks wait for rank 0 up to trainer.collective_timeout_s at start."""
    assert stale_lock_wait(600.0) == STALE_LOCK_WAIT_S == 300.0
    assert stale_lock_wait(20.0) == 10.0


@pytest.mark.parametrize("subdir", ["${hydra.job.num}", "trial/${hydra.job.num}"])
def test_a_sweep_guard_finds_earlier_jobs_as_deep_as_its_subdir(tmp_path, subdir):
    """Job numbers start from 0 in every sweep, so an earlier sweep's numbered jobs are where
    this one's go; with a two-level subdir they were not looked for (one level only)."""
    job = tmp_path / "sweep" / subdir.replace("${hydra.job.num}", "0")
    (job / "checkpoints" / "step_2").mkdir(parents=True)
    (job / "metrics.json").write_text("{}")
    config = OmegaConf.create(
        {
            "hydra": {"sweep": {"dir": str(tmp_path / "sweep"), "subdir": subdir}},
            "trainer": {"resume_from": None, "checkpoint_dir": "checkpoints"},
            "overwrite": False,
        }
    )
    name = job.relative_to(tmp_path / "sweep").as_posix()
    with pytest.raises(SystemExit) as refused:
        RunDirGuard().on_multirun_start(config)
    assert str(refused.value).startswith(
        f"Error: sweep directory {tmp_path / 'sweep'} already holds another sweep's outputs "
        f"({name}/metrics.json, {name}/checkpoints/); "
    )
    with pytest.raises(SystemExit) as planned:  # dmt-plan's guard looks as deep
        PlanRunDirGuard().on_multirun_start(config)
    assert f"run directory {job} holds a training run's outputs" in str(planned.value)


def test_a_checkpoint_dir_linked_into_the_run_dir_is_the_run_dirs(tmp_path):
    """A trainer.checkpoint_dir whose link leads into the run directory is covered by the run
    directory's lock (no lock file of its own among the checkpoints); one whose link leads out
    of it is held on its own."""
    run = tmp_path / "run"
    (run / "checkpoints").mkdir(parents=True)
    (tmp_path / "link").symlink_to(run / "checkpoints")
    (tmp_path / "out").mkdir()
    (tmp_path / "outlink").symlink_to(tmp_path / "out")
    assert checkpoint_dir_outside(run, str(tmp_path / "link")) is None
    assert checkpoint_dir_outside(run, str(tmp_path / "outlink")) == tmp_path / "out"
    with claim_run_dir(run, resume_from=None, checkpoint_dir=str(tmp_path / "link")):
        assert lock_held(run) and not (run / "checkpoints" / LOCK_FILE).exists()
    with claim_run_dir(run, resume_from=None, checkpoint_dir=str(tmp_path / "outlink")):
        assert lock_held(run) and lock_held(tmp_path / "out")
