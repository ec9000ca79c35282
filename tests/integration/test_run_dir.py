"""Safe outputs end to end: a run never writes over another run's directory (issue 10, point 5)."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from dmt.train import train
from tests.conftest import REPO, compose_config, free_port, torchrun, two_rank_env

TINY = [
    "logger=disabled",
    "trainer.progress_bar=false",
    "data.synthetic.num_train=4096",
    "data.synthetic.num_val=1024",
    "data.synthetic.num_test=1024",
    "data.batch_size=256",
]
DMT_TRAIN = os.path.join(os.path.dirname(sys.executable), "dmt-train")


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([DMT_TRAIN, *args], cwd=REPO, capture_output=True, text=True, timeout=300)


def _files(run_dir, but: str = "") -> dict[str, bytes]:
    """Every file under ``run_dir`` by relative path, with its bytes (``but``: one left out)."""
    return {
        str(p.relative_to(run_dir)): p.read_bytes()
        for p in sorted(run_dir.rglob("*"))
        if p.is_file() and str(p.relative_to(run_dir)) != but
    }


def _refused_leaving_the_run(run, *overrides) -> str:
    """dmt-train with ``overrides`` on the run in ``run``: it must exit 1 and leave every file
    there as it was but the lock's holder record (the refused run held the lock while it
    checked); returns its error (stderr, stripped)."""
    before = _files(run, but="run.lock")
    refused = _cli(*overrides)
    assert refused.returncode == 1, refused.stderr[-3000:]
    assert _files(run, but="run.lock") == before
    return refused.stderr.strip()


@pytest.mark.slow  # five CLI runs (44 s on 2 shared cores; CI time); the lock and the check of outputs: tests/unit/test_run_dir.py
def test_a_second_run_into_the_same_directory_stops_and_a_resume_goes_on(tmp_path):
    run = tmp_path / "run"
    first = _cli(*TINY, "trainer=smoke", "trainer.checkpoint=true", f"hydra.run.dir={run}")
    assert first.returncode == 0, first.stderr[-3000:]
    before = _files(run)
    assert "metrics.json" in before and ".hydra/config.yaml" in before

    second = _cli(*TINY, "trainer=smoke", "model=dcn", f"hydra.run.dir={run}")
    assert second.returncode == 1
    assert second.stderr.strip() == (
        f"Error: run directory {run} already holds another run's outputs (metrics.json, history.jsonl, checkpoints/); "
        "choose another hydra.run.dir (or leave it unset for a new one), or resume that run "
        f"with trainer.resume_from=auto or trainer.resume_from=<a checkpoint in {run}>"
    )
    assert _files(run) == before  # metrics, checkpoints, Hydra's files and the log untouched

    # a resume its checkpoint refuses stops before Hydra writes its config over the run's record
    third = _cli(*TINY, "trainer=smoke", "trainer.resume_from=auto", "model=dcn",
                 f"hydra.run.dir={run}")  # fmt: skip
    assert third.returncode == 1
    error = third.stderr.strip()
    assert error.startswith(f"Error: cannot resume from {run}/checkpoints/step_2: this run's config "
                            "differs from the checkpoint's "), error  # fmt: skip
    assert "model.name" in error
    # all but the lock's holder record (the refused run held the lock while it checked)
    assert _files(run, but="run.lock") == {k: v for k, v in before.items() if k != "run.lock"}
    before = _files(run)

    with pytest.raises(ValueError, match="already holds another run's outputs"):  # from Python too
        train(compose_config(*TINY, "trainer=smoke"), run)
    assert _files(run) == before

    resumed = train(
        compose_config(
            *TINY,
            "trainer=smoke",
            "trainer.max_steps=3",
            f"trainer.resume_from={run}/checkpoints",
        ),
        run,
    )
    assert resumed["num_steps"] == 3 == json.loads((run / "metrics.json").read_text())["num_steps"]

    # a task key that reads Hydra's job (unset before the job runs): the trainer checks it
    fourth = _cli(*TINY, "trainer=smoke", "trainer.max_steps=3", "trainer.resume_from=auto",
                  "logger.name=${hydra:job.name}", f"hydra.run.dir={run}")  # fmt: skip
    assert fourth.returncode == 0, fourth.stderr[-3000:]


@pytest.mark.slow  # a held run and three CLI runs (25-35 s on 2 shared cores); the lock itself: tests/unit/test_run_dir.py
def test_a_running_run_holds_its_directory_and_a_killed_one_does_not(tmp_path):
    run = tmp_path / "run"
    lock = run / "run.lock"
    holder = subprocess.Popen(
        [DMT_TRAIN, *TINY, "trainer.epochs=1000", f"hydra.run.dir={run}"],
        cwd=REPO,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 120
        hydra_written = [
            run / ".hydra" / f for f in ("config.yaml", "hydra.yaml", "overrides.yaml")
        ]
        log = run / "train.log"
        # the lock is taken before Hydra writes .hydra/: wait for both
        while not (
            lock.exists()
            and f"pid={holder.pid} " in lock.read_text()
            and all(f.exists() for f in hydra_written)
            and log.exists()  # Hydra opens the log after writing .hydra/
            and log.stat().st_size > 0
        ):
            assert holder.poll() is None and time.monotonic() < deadline, (
                "the first run did not start"
            )
            time.sleep(0.2)
        hydra_files = _files(run / ".hydra")
        second = _cli(*TINY, "trainer=smoke", f"hydra.run.dir={run}")
        assert second.returncode == 1
        message = second.stderr.strip()
        assert message.startswith(
            f"Error: run directory {run} is in use by another run "
            f"(pid {holder.pid} on host {socket.gethostname()}, started "
        ), message
        assert message.endswith("); choose another hydra.run.dir, or wait until that run has ended")
        assert _files(run / ".hydra") == hydra_files
        history = run / "history.jsonl"
        while not (history.exists() and history.stat().st_size > 0):  # its first log step
            assert holder.poll() is None and time.monotonic() < deadline, "no history written"
            time.sleep(0.2)
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait()
    # the kernel dropped the dead run's lock; its history is an output (a reproduced bug: a new
    # run wrote over it without a word), which a resume takes on, afresh without a checkpoint
    with pytest.raises(ValueError, match=r"already holds another run's outputs \(history.jsonl\)"):
        train(compose_config(*TINY, "trainer=smoke"), run)
    metrics = train(compose_config(*TINY, "trainer=smoke", "trainer.resume_from=auto"), run)
    assert metrics["num_steps"] == 2 and (run / "metrics.json").exists()


def _holding(*args: str, log, multirun: bool = False) -> subprocess.Popen:
    """dmt-train with ``args`` (training for long, no history.jsonl for a while: no outputs to
    refuse another run for), once it has written ``log`` (Hydra opens the log after writing
    ``.hydra/``, and after the lock is taken)."""
    holder = subprocess.Popen(
        [DMT_TRAIN, *(["-m"] if multirun else []), *TINY, "trainer.epochs=1000",
         "trainer.log_every=1000000", *args],
        cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    deadline = time.monotonic() + 120
    while not (log.exists() and log.stat().st_size > 0):
        if holder.poll() is not None or time.monotonic() > deadline:
            holder.kill()
            holder.wait()
            raise AssertionError("the first run did not start")
        time.sleep(0.2)
    return holder


@pytest.mark.slow  # a run held while a 2-rank torchrun job starts (20-30 s on 2 shared cores)
def test_a_second_jobs_ranks_are_refused_before_writing_into_a_held_directory(tmp_path):
    """Reproduced: a torchrun job of 2 ranks started into the directory of a running run was
    refused by its rank 0 only: rank 1, which took no lock and found no outputs yet, went on and
    Hydra wrote its .hydra/ record (other overrides, other config) over the running run's, and
    its train.rank1.log, before rank 0's refusal reached it. Now every rank waits for rank 0's
    verdict before Hydra writes anything."""
    run = tmp_path / "run"
    holder = _holding(f"hydra.run.dir={run}", log=run / "train.log")
    try:
        record = _files(run / ".hydra")
        cmd, env = torchrun("-m", "dmt.train", *TINY, "trainer=smoke", "model=dcn",
                            f"hydra.run.dir={run}")  # fmt: skip
        second = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True,
                                timeout=300)  # fmt: skip
        assert holder.poll() is None, "the first run ended during the test"
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait()
    assert second.returncode == 1
    assert (
        f"Error: run directory {run} is in use by another run (pid {holder.pid} on host "
        f"{socket.gethostname()}, started "
    ) in second.stderr, second.stderr[-3000:]
    assert _files(run / ".hydra") == record
    assert not (run / "train.rank1.log").exists()


@pytest.mark.slow  # two CLI runs (20-30 s on 2 shared cores)
def test_going_back_in_a_run_is_refused_before_hydra_rewrites_its_record(tmp_path):
    run = tmp_path / "run"
    first = _cli(*TINY, "trainer=smoke", "trainer.checkpoint_every=1", f"hydra.run.dir={run}")
    assert first.returncode == 0, first.stderr[-3000:]
    # the finished run's record (.hydra/overrides.yaml) does not claim a resume that never ran
    back = _refused_leaving_the_run(run, *TINY, "trainer=smoke", "trainer.checkpoint_every=1",
                                    f"trainer.resume_from={run}/checkpoints/step_1",
                                    f"hydra.run.dir={run}")  # fmt: skip
    assert back.startswith(
        f"Error: trainer.resume_from='{run}/checkpoints/step_1' goes back in this run: its "
        "checkpoint directory holds the newer step_2, "
    ), back


@pytest.mark.slow  # two CLI runs (21-27 s on 2 shared cores; CI time)
def test_a_resume_past_the_runs_end_is_refused_before_a_directory_is_made(tmp_path):
    """Reproduced bug: resuming a step-2 checkpoint with trainer.max_steps=1 "trained" nothing
    and reported num_steps 2, samples/s 0 and a NaN loss."""
    first = _cli(
        *TINY, "trainer=smoke", "trainer.checkpoint_every=1", f"hydra.run.dir={tmp_path / 'a'}"
    )
    assert first.returncode == 0, first.stderr[-3000:]
    step = tmp_path / "a" / "checkpoints" / "step_2"
    past = _cli(*TINY, "trainer=smoke", "trainer.max_steps=1", f"trainer.resume_from={step}",
                f"hydra.run.dir={tmp_path / 'b'}")  # fmt: skip
    assert past.returncode == 1
    assert past.stderr.strip() == (
        f"Error: trainer.resume_from='{step}' is at step 2, past this run's end at step 1 "
        "(trainer.max_steps=1, trainer.epochs=1): a run cannot train back to an earlier step; "
        "raise trainer.max_steps (or trainer.epochs), or score the checkpoint with dmt-eval"
    ), past.stderr[-3000:]
    assert not (tmp_path / "b").exists()


@pytest.mark.slow  # two CLI runs (20-30 s on 2 shared cores)
def test_a_resume_past_an_end_lowered_by_epochs_is_refused_before_hydra_writes(tmp_path):
    """Reproduced: a run resumed with trainer.epochs lowered below its checkpoint's step (an end
    set by epochs alone) was refused by the trainer only, after Hydra had rewritten the run's
    .hydra/ record with the refused settings. Past its first epoch a checkpoint's position
    gives the steps per epoch (16 here): step 20 is past 1 epoch's end, refused up front."""
    run = tmp_path / "run"
    args = [*TINY, "trainer=smoke", "trainer.epochs=2", f"hydra.run.dir={run}"]
    first = _cli(*args, "trainer.max_steps=20", "trainer.checkpoint_every=10")
    assert first.returncode == 0, first.stderr[-3000:]
    lowered = _refused_leaving_the_run(run, *args, "trainer.epochs=1", "trainer.max_steps=-1",
                                       "trainer.resume_from=auto",
                                       "trainer.resume_allow_config_change=true")  # fmt: skip
    step = run / "checkpoints" / "step_20"
    assert lowered == (
        f"Error: trainer.resume_from='{step}' is at step 20, past this run's end at step 16 "
        "(trainer.max_steps=-1, trainer.epochs=1): a run cannot train back to an earlier step; "
        "raise trainer.max_steps (or trainer.epochs), or score the checkpoint with dmt-eval"
    )


@pytest.mark.slow  # a training run and a CLI run (30-100 s on 2 shared cores)
def test_a_resume_whose_partition_file_changed_is_refused_before_hydra_writes(tmp_path):
    """The towers of a tp run's partition file are in its checkpoints' config.yaml: a resume
    whose file holds others by then (the same features in another order here) is refused up
    front, naming the file (it resumed into a model that fed the weights other features)."""
    run, partition = tmp_path / "run", tmp_path / "partition.yaml"
    partition.write_text("towers: [[cat_0, cat_1, cat_2], [cat_3, cat_4, cat_5]]\n")
    args = [*TINY, "trainer=smoke", "data.synthetic.num_sparse=6", "experiment=dmt_4t_dlrm",
            "partition=tp", f"model.partition.path={partition}", "model.partition.num_towers=2",
            f"hydra.run.dir={run}"]  # fmt: skip
    first = _cli(*args, "trainer.checkpoint=true")
    assert first.returncode == 0, first.stderr[-3000:]
    partition.write_text("towers: [[cat_2, cat_1, cat_0], [cat_3, cat_4, cat_5]]\n")
    refused = _refused_leaving_the_run(
        run, *args, "trainer.max_steps=3", "trainer.resume_from=auto"
    )
    step = run / "checkpoints" / "step_2"
    assert refused == (
        f"Error: cannot resume from {step}: this run's config differs from the checkpoint's "
        f"{step / 'config.yaml'} in model.partition.recorded_towers: partition file "
        f"'{partition}' holds other towers than the checkpoint trained (tower 0: [cat_0, cat_1, "
        "cat_2] -> [cat_2, cat_1, cat_0] (the same features in another order))"
    )


def _trained_on_two_ranks(*overrides: str) -> None:
    """``dmt-train`` under torchrun on 2 ranks, which must succeed."""
    cmd, env = torchrun("-m", "dmt.train", *overrides)
    run = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]


@pytest.mark.slow  # a 2-rank torchrun run and two CLI runs (35-50 s on 2 shared cores)
def test_a_resume_into_other_column_blocks_is_refused_before_hydra_writes(tmp_path):
    """Reproduced: an SPTT run with row-wise Adagrad on column-wise tables (2 ranks per tower: 2
    column blocks) resumed by one process (the whole table: its state cannot be resharded) was
    refused by the trainer only, once it loaded the checkpoint: after Hydra had rewritten the
    run's .hydra/ record and the trainer the run's sharding_plan.txt with the plan of a layout
    that never trained."""
    run = tmp_path / "run"
    args = [*TINY, "trainer=smoke", "experiment=dmt_4t_dlrm", "model.partition.num_towers=1",
            "sptt=on", "sptt.sharding_type=column_wise", f"hydra.run.dir={run}"]  # fmt: skip
    _trained_on_two_ranks(*args, "trainer.checkpoint=true")
    one = _refused_leaving_the_run(run, *args, "trainer.max_steps=3", "trainer.resume_from=auto")
    step = run / "checkpoints" / "step_2"
    assert one == (
        f"Error: cannot resume from {step}: model.towers.0.embedding_bag_collection.embedding_bags"
        ".t_cat_0.weight.momentum_1 (row-wise optimizer state of a column-wise table) was saved "
        "for column blocks ['.cols_0_8', '.cols_8_16'], and this run needs (whole table); resume "
        "with the same sptt.sharding_type and ranks per tower (sptt.local_world_size x "
        "sptt.hosts_per_tower), or train with optim.sparse._target_=torch.optim.Adagrad or "
        "torch.optim.SGD, whose state reshards freely"
    )
    # the remedy the message names: exact Adagrad starts its state afresh and resumes (the
    # check had read the checkpoint's row-wise state whatever this run's optimizer keeps)
    exact = _cli(*args, "trainer.max_steps=3", "trainer.resume_from=auto",
                 "trainer.resume_allow_config_change=true",
                 "optim.sparse._target_=torch.optim.Adagrad")  # fmt: skip
    assert exact.returncode == 0, exact.stderr[-3000:]
    assert json.loads((run / "metrics.json").read_text())["num_steps"] == 3


@pytest.mark.slow  # a 2-rank torchrun run and a CLI run (30-40 s on 2 shared cores)
def test_a_resume_into_other_towers_is_refused_before_hydra_writes(tmp_path):
    """Reproduced: an SPTT run of 2 towers (2 ranks, one per tower) resumed by one process
    (T = 1) was refused by the trainer only, with a traceback, once it sharded the model: after
    Hydra had rewritten the run's .hydra/ record with the refused run's settings."""
    run = tmp_path / "run"
    args = [*TINY, "trainer=smoke", "experiment=dmt_4t_dlrm", "model.partition.num_towers=2",
            "sptt=on", "sptt.local_world_size=1", f"hydra.run.dir={run}"]  # fmt: skip
    _trained_on_two_ranks(*args, "trainer.checkpoint=true")
    one = _refused_leaving_the_run(run, *args, "trainer.max_steps=3", "trainer.resume_from=auto")
    assert one == (
        f"Error: cannot resume from {run / 'checkpoints' / 'step_2'}: the model's partition has "
        "2 towers but the topology has T=1 towers (G=1 ranks, L=1 per host, K=1 hosts per "
        "tower: T = G / (K L)); SPTT needs exactly one model tower per topology tower. "
        "Partition the features into 1 towers, or use more ranks or change "
        "sptt.hosts_per_tower so that G / (K L) = 2"
    )


@pytest.mark.slow  # four CLI multiruns (40-50 s on 2 shared cores)
def test_a_sweep_into_another_sweeps_directory_stops_before_rewriting_its_records(tmp_path):
    """A reproduced bug: the second sweep rewrote job 0's .hydra/overrides.yaml (so its
    metrics.json was read as the result of settings that never ran) before job 0 was refused.
    Jobs in directories of their own (a subdir per seed: seeds added to a study) go on."""
    sweep = tmp_path / "sweep"
    first = _cli("-m", *TINY, "trainer=smoke", "optim.lr=1e-3,2e-3", f"hydra.sweep.dir={sweep}")
    assert first.returncode == 0, first.stderr[-3000:]
    before = _files(sweep)
    second = _cli("-m", *TINY, "trainer=smoke", "optim.sparse_lr=0.2,0.3",
                  f"hydra.sweep.dir={sweep}")  # fmt: skip
    assert second.returncode == 1
    assert second.stderr.strip().endswith(
        f"Error: sweep directory {sweep} already holds another sweep's outputs "
        "(0/metrics.json, 0/history.jsonl, 1/metrics.json, 1/history.jsonl); choose another hydra.sweep.dir (or leave it unset "
        "for a new one), or resume that sweep with trainer.resume_from=auto"
    ), second.stderr[-3000:]
    assert _files(sweep) == before
    study = tmp_path / "study"
    for seeds in ("0", "1"):
        run = _cli("-m", *TINY, "trainer=smoke", f"trainer.seed={seeds}",
                   f"hydra.sweep.dir={study}", "hydra.sweep.subdir=seed_${trainer.seed}")  # fmt: skip
        assert run.returncode == 0, run.stderr[-3000:]
    assert all((study / f"seed_{s}" / "metrics.json").exists() for s in (0, 1))


@pytest.mark.slow  # several CLI runs (18-22 s on 2 shared cores; CI time)
def test_a_run_or_sweep_directory_where_a_file_is_stops_with_one_line(tmp_path):
    """A reproduced bug: a hydra.run.dir (hydra.sweep.dir) that is a file, or inside one, made
    the guard raise NotADirectoryError / FileExistsError, which Hydra turned into a warning, and
    the job then failed with Hydra's traceback making the same directory; the file stays (both
    forms of each: tests/unit/test_run_dir.py)."""
    notes = tmp_path / "notes.txt"
    notes.write_text("my notes\n")
    for setting, target, multirun in (
        ("hydra.run.dir", notes / "run", []),
        ("hydra.sweep.dir", notes, ["-m"]),
    ):
        refused = _cli(*multirun, *TINY, "trainer=smoke", f"{setting}={target}")
        assert refused.returncode == 1
        kind = setting.split(".")[1]
        assert refused.stderr.strip() == (
            f"Error: {kind} directory {target}: {notes} is not a directory; choose another "
            f"{setting}"
        ), refused.stderr[-3000:]
    assert notes.read_text() == "my notes\n"


@pytest.mark.slow  # a sweep held while another starts (15-25 s on 2 shared cores)
def test_a_second_sweep_into_a_running_sweeps_directory_stops_before_writing(tmp_path):
    """Reproduced: a sweep started into the directory of a running sweep whose jobs had no
    outputs yet wrote its multirun.yaml and job 0's .hydra/ record (model=dcn) over the running
    sweep's, appended its traceback to job 0's train.log once job 0's lock refused it, and
    wrote a trials table of the running job as if it were its own."""
    sweep = tmp_path / "sweep"
    holder = _holding(f"hydra.sweep.dir={sweep}", log=sweep / "0" / "train.log", multirun=True)
    try:
        before = _files(sweep)
        second = _cli("-m", *TINY, "trainer=smoke", "model=dcn", f"hydra.sweep.dir={sweep}")
        assert holder.poll() is None, "the first sweep ended during the test"
        after = _files(sweep)
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait()
    assert second.returncode == 1
    message = second.stderr.strip()
    assert message.startswith(
        f"Error: sweep directory {sweep} is in use by another sweep (pid {holder.pid} on host "
        f"{socket.gethostname()}, started "
    ), message[-3000:]
    assert message.endswith("); choose another hydra.sweep.dir, or wait until that sweep has ended")
    records = [name for name in before if name.endswith(".yaml")]
    assert "multirun.yaml" in records and "0/.hydra/overrides.yaml" in records
    assert {name: after[name] for name in records} == {name: before[name] for name in records}
    assert not (sweep / "trials.csv").exists()


@pytest.mark.slow  # five CLI multiruns (50-60 s on 2 shared cores)
def test_a_refused_sweep_job_keeps_the_record_of_the_run_in_its_directory(tmp_path):
    """Reproduced bugs: Hydra writes a job's .hydra/ record before any callback runs, so a job
    refused for the run in its directory replaced that run's record with its own settings; the
    trials table (and confirm_trials.py) then read the run's metrics.json as the result of
    settings that never ran: in a second multirun with a subdir per seed, and in a sweep resumed
    with other settings (trainer.resume_from=auto; an Optuna sweep continued with another
    search space draws other settings for its numbered jobs)."""
    study = tmp_path / "study"
    first = _cli("-m", *TINY, "trainer=smoke", "optim.lr=1e-3", "trainer.seed=0",
                 f"hydra.sweep.dir={study}", "hydra.sweep.subdir=seed_${trainer.seed}")  # fmt: skip
    assert first.returncode == 0, first.stderr[-3000:]
    before = _files(study / "seed_0")
    second = _cli("-m", *TINY, "trainer=smoke", "optim.lr=2e-3", "trainer.seed=0,1",
                  f"hydra.sweep.dir={study}", "hydra.sweep.subdir=seed_${trainer.seed}")  # fmt: skip
    assert second.returncode == 1
    assert f"run directory {study / 'seed_0'} already holds another run's outputs" in second.stderr
    after = _files(study / "seed_0")
    assert {k: v for k, v in after.items() if k not in ("run.lock", "train.log")} == {
        k: v for k, v in before.items() if k not in ("run.lock", "train.log")
    }
    assert (study / "seed_1" / "metrics.json").exists()
    assert b"optim.lr=0.002" in (study / "seed_1" / ".hydra" / "overrides.yaml").read_bytes()
    rows = (study / "trials.csv").read_text().splitlines()
    assert rows[1].startswith("0,ok,") and ",0.001,0" in rows[1]  # seed_0: its own lr
    assert rows[2].startswith("1,ok,") and ",0.002,1" in rows[2]

    sweep = tmp_path / "sweep"
    ckpt = ["trainer=smoke", "trainer.checkpoint=true", f"hydra.sweep.dir={sweep}"]
    first = _cli("-m", *TINY, *ckpt, "optim.lr=1e-3")
    assert first.returncode == 0, first.stderr[-3000:]
    before = _files(sweep / "0")
    other = _cli("-m", *TINY, *ckpt, "optim.lr=2e-3", "trainer.resume_from=auto")
    assert other.returncode == 1
    assert "this run's config differs from the checkpoint's" in other.stderr
    after = _files(sweep / "0")
    assert {k: v for k, v in after.items() if k not in ("run.lock", "train.log")} == {
        k: v for k, v in before.items() if k not in ("run.lock", "train.log")
    }
    same = _cli("-m", *TINY, *ckpt, "optim.lr=1e-3", "trainer.resume_from=auto")
    assert same.returncode == 0, same.stderr[-3000:]  # the same settings resume their run
    assert b"trainer.resume_from=auto" in (sweep / "0" / ".hydra" / "overrides.yaml").read_bytes()


@pytest.mark.slow  # two CLI multiruns (20-30 s on 2 shared cores)
def test_a_sweep_job_refused_by_a_stopped_runs_checkpoint_keeps_the_runs_record(tmp_path):
    """Reproduced: a job directory holding a run stopped after a complete checkpoint, without
    its metrics.json (preempted), counted as one that trainer.resume_from=auto starts afresh
    over, so a sweep resumed with other settings wrote its record over that run's before the
    trainer refused to resume the checkpoint with them: the record said lr=0.002 of a run that
    trained with lr=0.001."""
    sweep = tmp_path / "sweep"
    ckpt = ["trainer=smoke", "trainer.checkpoint=true", f"hydra.sweep.dir={sweep}"]
    first = _cli("-m", *TINY, *ckpt, "optim.lr=1e-3")
    assert first.returncode == 0, first.stderr[-3000:]
    (sweep / "0" / "metrics.json").unlink()  # stopped after its checkpoint at step 2
    before = _files(sweep / "0")
    other = _cli("-m", *TINY, *ckpt, "optim.lr=2e-3", "trainer.resume_from=auto",
                 "trainer.max_steps=4")  # fmt: skip
    assert other.returncode == 1
    assert "this run's config differs from the checkpoint's" in other.stderr
    after = _files(sweep / "0")
    assert {k: v for k, v in after.items() if k not in ("run.lock", "train.log")} == {
        k: v for k, v in before.items() if k not in ("run.lock", "train.log")
    }
    assert b"optim.lr=0.001" in (sweep / "0" / ".hydra" / "overrides.yaml").read_bytes()


@pytest.mark.slow  # a training run and a CLI run (30-100 s on 2 shared cores)
def test_a_sweep_job_into_a_live_runs_directory_writes_nothing_there(tmp_path):
    """Reproduced: a multirun job whose directory was a running run's (no outputs there yet)
    had Hydra write its .hydra/ record (model=dcn, optim.lr=0.5) over the running run's, and
    append its log lines to that run's train.log, before the run's lock refused it."""
    run = tmp_path / "run"
    holder = _holding(f"hydra.run.dir={run}", log=run / "train.log")
    try:
        record = _files(run / ".hydra")
        second = _cli("-m", *TINY, "trainer=smoke", "model=dcn", "optim.lr=0.5",
                      f"hydra.sweep.dir={tmp_path}", "hydra.sweep.subdir=run")  # fmt: skip
        assert holder.poll() is None, "the first run ended during the test"
        after = _files(run / ".hydra")
        log = (run / "train.log").read_text()
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait()
    assert second.returncode == 1
    assert (
        f"run directory {run} is in use by another run (pid {holder.pid} on host "
        f"{socket.gethostname()}, started "
    ) in second.stderr, second.stderr[-3000:]
    assert after == record
    assert log.count("[dmt.runtime]") == 1, log  # the running run's line, not the job's too


@pytest.mark.slow  # a run held while another starts (15-35 s on 2 shared cores)
def test_a_second_live_run_into_a_runs_absolute_checkpoint_dir_stops_at_start(tmp_path):
    """Reproduced: two runs with their own hydra.run.dir and one absolute
    trainer.checkpoint_dir, started together, both trained (the directory was empty) until one
    failed at its first save: "checkpoint .../step_5 exists already; dmt never overwrites a
    complete checkpoint". The second now stops at start, naming the setting and its holder,
    before Hydra makes its run directory (the lock itself: tests/unit/test_run_dir.py)."""
    first, second, ckpt = tmp_path / "first", tmp_path / "second", tmp_path / "ckpt"
    holder = _holding(f"hydra.run.dir={first}", f"trainer.checkpoint_dir={ckpt}",
                      "trainer.checkpoint=true", log=first / "train.log")  # fmt: skip
    try:
        refused = _cli(*TINY, "trainer=smoke", "trainer.checkpoint_every=1",
                       f"trainer.checkpoint_dir={ckpt}", f"hydra.run.dir={second}")  # fmt: skip
        assert holder.poll() is None, "the first run ended during the test"
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait()
    assert refused.returncode == 1
    message = refused.stderr.strip()
    assert message.startswith(
        f"Error: trainer.checkpoint_dir={ckpt} is in use by another run (pid {holder.pid} on "
        f"host {socket.gethostname()}, started "
    ), message[-3000:]
    assert message.endswith(
        "); choose another trainer.checkpoint_dir, or wait until that run has ended"
    )
    assert not second.exists()
    assert [p.name for p in ckpt.iterdir()] == ["run.lock"]


@pytest.fixture(scope="module")
def two_rank_console(tmp_path_factory) -> tuple[Path, list[str]]:
    """A 2-rank torchrun run's directory and console (stdout: dmt's log lines, every rank's)."""
    run = tmp_path_factory.mktemp("console") / "run"
    cmd, env = torchrun("-m", "dmt.train", *TINY, "trainer=smoke", f"hydra.run.dir={run}")
    done = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return run, done.stdout.splitlines()


@pytest.mark.slow  # a 2-rank torchrun run (17-25 s): CI's suite stays under 15 minutes
def test_rank_0_names_the_run_directory_as_the_run_starts(two_rank_console):
    """A job's console (every rank's output in one SLURM log) never named the run directory
    until rank 0's last line, and a run that failed never did: where its logs, history.jsonl
    and checkpoints were was the user's guess (``outputs/<date>/<time>-<pid>`` by default)."""
    run, lines = two_rank_console
    said = [i for i, line in enumerate(lines) if line.endswith(f"][INFO] - run directory {run}")]
    assert len(said) == 1, lines  # rank 0's, once
    assert said[0] < next(i for i, line in enumerate(lines) if line.startswith("val_auc="))


@pytest.mark.slow  # a 2-rank torchrun run (17-25 s): CI's suite stays under 15 minutes
def test_the_host_memory_setting_of_every_rank_is_said_once(two_rank_console):
    """Every rank logged the same line that freed host memory is kept for reuse (64 alike in
    the log of a job of 64 ranks): rank 0 says it for all."""
    said = [line for line in two_rank_console[1] if "host memory: freed memory is kept" in line]
    assert len(said) == 1, two_rank_console[1]


@pytest.mark.slow  # a 2-rank torchrun run (17-25 s): CI's suite stays under 15 minutes
def test_every_ranks_console_lines_name_the_rank(two_rank_console):
    """A job's console gathers every rank's log lines, which said nothing of the rank: rank 17's
    warning read as rank 0's. Now each line of a world of several starts with its rank, as
    torch's own do; the log files (one per rank) keep their lines as they were."""
    run, lines = two_rank_console
    logged = [line for line in lines if re.search(r"\]\[(INFO|WARNING|ERROR)\] - ", line)]
    assert logged and all(line.startswith(("[rank0][", "[rank1][")) for line in logged), lines
    for rank in (0, 1):
        said = [line for line in logged if f"][dmt.runtime][INFO] - rank {rank} of 2 " in line]
        assert len(said) == 1 and said[0].startswith(f"[rank{rank}]["), logged
    for name in ("train.log", "train.rank1.log"):
        text = (run / name).read_text()
        assert "[dmt.runtime][INFO] - rank " in text and "[rank" not in text, text


@pytest.mark.slow  # a 2-rank torchrun run (17-25 s): CI's suite stays under 15 minutes
def test_without_the_progress_bar_rank_0_logs_each_step_and_evaluation_once(two_rank_console):
    """With ``trainer.progress_bar=false`` (trainer=smoke) a job's console said nothing of its
    training loss or evaluations until the final line: now each is one line, rank 0's."""
    lines = two_rank_console[1]
    steps = [line for line in lines if "][dmt.trainer][INFO] - step " in line]
    assert [line.split(" - ", 1)[1].split(":")[0] for line in steps] == [
        "step 1/2", "step 2/2", "step 2/2", "step 2/2"
    ], steps  # fmt: skip
    assert all(line.startswith("[rank0][") for line in steps), steps
    assert re.search(r" - step 2/2: val/auc \d\.\d{4}, val/logloss ", steps[2]), steps
    assert re.search(r" - step 2/2: test/auc \d\.\d{4}, test/logloss ", steps[3]), steps


@pytest.mark.slow  # a 2-rank torchrun run (25-35 s on 2 shared cores): CI's suite time
def test_every_ranks_python_warning_is_a_log_line_naming_the_rank(tmp_path):
    """Reproduced: a run that diverged on 2 ranks printed the metrics' RuntimeWarning to stderr
    twice, alike, without a rank (whose?), and neither rank's log file had it. Now each rank's
    is a line of its console log naming the rank, and of its log file, and stderr has none."""
    run = tmp_path / "run"
    cmd, env = torchrun("-m", "dmt.train", *TINY, "trainer=smoke", "optim.lr=1e30",
                        f"hydra.run.dir={run}")  # fmt: skip
    done = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    said = "RuntimeWarning: 1024 of 1024 predictions are not finite (NaN or inf): the model"
    assert said not in done.stderr, done.stderr[-3000:]
    warned = [line for line in done.stdout.splitlines() if said in line]
    assert sorted(line.split("][", 1)[0] for line in warned) == ["[rank0", "[rank1"], warned
    assert all("][py.warnings][WARNING] - " in line for line in warned), warned
    for name in ("train.log", "train.rank1.log"):
        assert (run / name).read_text().count(said) == 1, name


def _two_ranks(tmp_path, launcher: str, *overrides: str) -> list[subprocess.CompletedProcess]:
    """``dmt-train <overrides>`` as ranks 0 and 1 of a world set by environment variables: a
    task of an ``srun`` step each (``launcher="srun"``), or given torchrun's variables by hand
    (``"env"``)."""
    port, procs = free_port(), []
    for rank in (0, 1):
        env = two_rank_env(launcher, rank, port)
        procs.append(
            subprocess.Popen(
                [sys.executable, "-m", "dmt.train", *overrides],
                cwd=REPO,
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )  # fmt: skip
        )
    try:  # a rank that waits for its peer's timeout fails the test here
        outs = [p.communicate(timeout=120) for p in procs]
    finally:
        for p in procs:
            p.kill()
    return [
        subprocess.CompletedProcess(p.args, p.returncode, o, e) for p, (o, e) in zip(procs, outs)
    ]


@pytest.mark.parametrize(
    ("launcher", "refused"),
    [
        ("srun", "setting"),  # two processes that stop at start (10-30 s on 2 shared cores)
        pytest.param("env", "setting", marks=pytest.mark.slow),  # CI time: the same check
        pytest.param("srun", "directory", marks=pytest.mark.slow),  # and the ranks meet
        # row-wise tables too few for the launcher's ranks per host (LOCAL_WORLD_SIZE): each
        # rank raised it, with Hydra's traceback, after Hydra wrote the run directory
        pytest.param("env", "rows", marks=pytest.mark.slow),
    ],
)
def test_a_refusal_is_said_once_by_rank_0_and_every_rank_exits_1(tmp_path, launcher, refused):
    """A setting that validation refuses, or a run directory with another run's outputs, was
    printed by every rank (64 copies in a job of 64 ranks' log). Now rank 0 says it; every rank
    still exits with status 1 (srun reports each task's), none leaves a run directory behind."""
    run = tmp_path / "run"
    if refused == "directory":
        run.mkdir()
        (run / "metrics.json").write_text("{}\n")
        bad, error = (
            [],
            f"Error: run directory {run} already holds another run's outputs (metrics.json); "
            "choose another hydra.run.dir (or leave it unset for a new one), or resume that run "
            f"with trainer.resume_from=auto or trainer.resume_from=<a checkpoint in {run}>",
        )
    elif refused == "rows":
        bad, error = (
            ["sptt=on", "+partition=naive", "model.partition.num_towers=2",
             "sptt.sharding_type=row_wise", "data.synthetic.cardinality=1"],
            "Error: sptt.sharding_type=row_wise puts a row block of every table on each of the "
            "K*L=2 ranks of its tower (sptt.hosts_per_tower=1, L=2 ranks per host "
            "(LOCAL_WORLD_SIZE)), but the table of feature cat_0 has 1 row "
            "(data.synthetic.cardinality=1): a row-wise table needs at least 2 rows; give it "
            "more, or use sptt.sharding_type=table_wise or column_wise",
        )  # fmt: skip
    else:
        bad, error = ["trainer.log_every=0"], "Error: trainer.log_every=0 must be positive"
    done = _two_ranks(tmp_path, launcher, *TINY, "trainer=smoke", *bad, f"hydra.run.dir={run}")
    assert [d.returncode for d in done] == [1, 1], [d.stderr[-3000:] for d in done]
    assert [d.stderr.strip() for d in done] == [error, ""]
    assert [d.stdout for d in done] == ["", ""]
    if refused == "directory":  # the run's outputs as they were
        assert (run / "metrics.json").read_text() == "{}\n" and not (run / ".hydra").exists()
    else:
        assert not run.exists()


@pytest.mark.slow  # a 2-rank torchrun start (~10 s)
def test_under_torchrun_a_refused_setting_is_said_once(tmp_path):
    """As above, under torchrun: its agent ends the job at rank 0's exit status 1."""
    run = tmp_path / "run"
    cmd, env = torchrun("-m", "dmt.train", *TINY, "trainer=smoke", "trainer.log_every=0",
                        f"hydra.run.dir={run}")  # fmt: skip
    done = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 1, done.stderr[-3000:]
    said = [line for line in done.stderr.splitlines() if line.startswith("Error: ")]
    assert said == ["Error: trainer.log_every=0 must be positive"], done.stderr[-3000:]
    assert not run.exists()
