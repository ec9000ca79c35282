"""The launcher's world from its environment (``dmt.runtime.world_from_env``), no processes.

The SLURM environments are what SLURM 22.05 gives a task of ``srun -N2 --ntasks-per-node=1`` and
the batch script of ``sbatch -N2 --ntasks-per-node=2`` (recorded on the cluster that
``scripts/slurm_smoke.sh`` starts), trimmed to the variables that matter.
"""

from __future__ import annotations

import socket
from datetime import timedelta

import pytest
import torch.distributed as dist

from dmt.runtime import (
    _NCCL_DUMP_KEY,
    TORCHRUN_VARS,
    World,
    _elastic_store,
    agree_on_backend,
    agree_on_devices,
    cuda_index,
    first_host,
    mixed_backends,
    shared_devices,
    slurm_port,
    tasks_per_node,
    world_from_env,
)

# Task 1 of a 2-node step, one task per node (srun -N2 --ntasks-per-node=1, job 12).
SLURM_STEP_TASK = {
    "SLURM_JOB_ID": "12",
    "SLURM_JOBID": "12",
    "SLURM_STEP_ID": "0",
    "SLURM_STEPID": "0",
    "SLURM_PROCID": "1",
    "SLURM_LOCALID": "0",
    "SLURM_NODEID": "1",
    "SLURM_NTASKS": "2",
    "SLURM_NPROCS": "2",
    "SLURM_NTASKS_PER_NODE": "1",
    "SLURM_STEP_NUM_TASKS": "2",
    "SLURM_STEP_NUM_NODES": "2",
    "SLURM_STEP_TASKS_PER_NODE": "1(x2)",
    "SLURM_TASKS_PER_NODE": "1(x2)",
    "SLURM_STEP_NODELIST": "n[1-2]",
    "SLURM_JOB_NODELIST": "n[1-2]",
    "SLURM_NODELIST": "n[1-2]",
    "SLURM_JOB_NUM_NODES": "2",
}
# The batch script of sbatch -N2 --ntasks-per-node=2 (job 2): no step, SLURM_PROCID=0.
SLURM_BATCH = {
    "SLURM_JOB_ID": "2",
    "SLURM_PROCID": "0",
    "SLURM_LOCALID": "0",
    "SLURM_NODEID": "0",
    "SLURM_NTASKS": "4",
    "SLURM_NTASKS_PER_NODE": "2",
    "SLURM_TASKS_PER_NODE": "2(x2)",
    "SLURM_JOB_NODELIST": "n[1-2]",
    "SLURM_JOB_NUM_NODES": "2",
}
TORCHRUN = {
    "RANK": "3",
    "WORLD_SIZE": "4",
    "LOCAL_RANK": "1",
    "LOCAL_WORLD_SIZE": "2",
    "MASTER_ADDR": "head",
    "MASTER_PORT": "29500",
}


def test_laptop_is_a_world_of_one_on_an_in_process_store() -> None:
    assert world_from_env({"HOME": "/root"}) == World(0, 1, 0, 1, None, None, "none")


def test_torchrun() -> None:
    assert world_from_env(TORCHRUN) == World(3, 4, 1, 2, "head", 29500, "torchrun")


def test_torchrun_wins_inside_a_slurm_allocation() -> None:
    # A plain torchrun in the batch script of a 4-task job, or in a job step.
    assert world_from_env({**SLURM_BATCH, **TORCHRUN}) == world_from_env(TORCHRUN)
    assert world_from_env({**SLURM_STEP_TASK, **TORCHRUN}) == world_from_env(TORCHRUN)


def test_torchrun_world_of_one_keeps_its_rendezvous() -> None:
    env = {"RANK": "0", "WORLD_SIZE": "1", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29400"}
    assert world_from_env(env) == World(0, 1, 0, 1, "127.0.0.1", 29400, "torchrun")


def test_slurm_multi_node_step() -> None:
    assert world_from_env(SLURM_STEP_TASK) == World(
        rank=1,
        world_size=2,
        local_rank=0,
        local_world_size=1,
        master_addr="n1",
        master_port=12012,
        launcher="slurm",
        slurm_task=1,
        slurm_node=1,
    )


def test_slurm_port_from_job_id_and_master_overrides() -> None:
    env = {**SLURM_STEP_TASK, "SLURM_JOB_ID": "1234567"}
    assert world_from_env(env).master_port == 12000 + 1234567 % 20000 == slurm_port(1234567, 0)
    # step 1 of the same job (srun ... & srun ... &): its own port
    assert (
        world_from_env({**env, "SLURM_STEP_ID": "1"}).master_port
        == 12000 + (1234567 + 7919) % 20000
    )
    env = {**SLURM_STEP_TASK, "MASTER_ADDR": "10.0.0.5", "MASTER_PORT": "29555"}
    world = world_from_env(env)
    assert (world.master_addr, world.master_port, world.launcher) == ("10.0.0.5", 29555, "slurm")


def test_slurm_uneven_tasks_per_node() -> None:
    # 7 tasks on 4 nodes laid out 2,2,2,1: the last node's task is alone on its host.
    env = {
        **SLURM_STEP_TASK,
        "SLURM_PROCID": "6",
        "SLURM_NODEID": "3",
        "SLURM_NTASKS": "7",
        "SLURM_STEP_NUM_TASKS": "7",
        "SLURM_STEP_TASKS_PER_NODE": "2(x3),1",
        "SLURM_STEP_NODELIST": "gpu-[001-004]",
    }
    world = world_from_env(env)
    assert (world.rank, world.world_size, world.local_world_size) == (6, 7, 1)
    assert world.master_addr == "gpu-001"


def test_slurm_single_task_step_is_a_world_of_one() -> None:
    env = {
        "SLURM_JOB_ID": "5",
        "SLURM_STEP_ID": "0",
        "SLURM_PROCID": "0",
        "SLURM_LOCALID": "0",
        "SLURM_NODEID": "0",
        "SLURM_NTASKS": "1",
        "SLURM_STEP_NUM_TASKS": "1",
        "SLURM_STEP_TASKS_PER_NODE": "1",
        "SLURM_JOB_NODELIST": "n1",
    }
    assert world_from_env(env) == World(0, 1, 0, 1, None, None, "slurm")


def test_multi_task_job_as_a_world_of_one_is_refused() -> None:
    # dmt-train started in the batch script of a 4-task job, outside srun.
    with pytest.raises(ValueError) as err:
        world_from_env(SLURM_BATCH)
    assert str(err.value) == (
        "this process is one of 4 SLURM tasks but would train as a world of one "
        "(SLURM_JOB_ID=2, SLURM_PROCID=0, SLURM_NTASKS=4, SLURM_LOCALID=0, SLURM_NODEID=0, "
        "SLURM_TASKS_PER_NODE=2(x2), SLURM_NTASKS_PER_NODE=2, SLURM_JOB_NODELIST=n[1-2]); "
        "start one dmt process per task in a job step (srun, or hydra/launcher=slurm), "
        "or give torchrun a world that covers the job's tasks"
    )


def test_torchrun_world_of_one_per_slurm_task_is_refused() -> None:
    # srun -N2 torchrun --standalone --nproc-per-node=1: two worlds of one.
    env = {
        **SLURM_STEP_TASK,
        "RANK": "0",
        "WORLD_SIZE": "1",
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": "29400",
    }
    with pytest.raises(ValueError, match=r"^this process is one of 2 SLURM tasks but would train"):
        world_from_env(env)


def test_slurm_ports_stay_below_the_ephemeral_range_and_apart_for_the_steps_of_a_job() -> None:
    for job in (0, 1, 12, 19999, 20000, 1234567, 2**32 - 1):
        ports = [slurm_port(job, step) for step in range(64)]
        assert all(12000 <= p < 32000 for p in ports)  # Linux's ephemeral ports start at 32768
        assert len(set(ports)) == len(ports)


def test_a_standalone_torchrun_in_each_task_of_a_step_is_refused() -> None:
    # srun -N2 --ntasks-per-node=1 torchrun --standalone --nproc-per-node=8: two worlds of 8
    standalone = {**SLURM_STEP_TASK, **TORCHRUN, "WORLD_SIZE": "8", "GROUP_WORLD_SIZE": "1"}
    with pytest.raises(ValueError) as err:
        world_from_env(standalone)
    assert str(err.value).startswith(
        "this process's torchrun is alone in its rendezvous (GROUP_WORLD_SIZE=1) but is one of 2 "
        "tasks of a SLURM job step, so each task's torchrun would train a world of 8 of its own ("
    )
    assert str(err.value).endswith(
        "give torchrun --nnodes=2 and one --rdzv-endpoint for all tasks, or start it in a step "
        "of one task (srun --ntasks=1)"
    )
    # the same torchrun with --nnodes=2 (one agent per task), in a step of one task, or in the
    # batch script (no step) forms the world the user asked for
    assert world_from_env({**standalone, "GROUP_WORLD_SIZE": "2"}).world_size == 8
    one_task = {**standalone, "SLURM_STEP_NUM_TASKS": "1", "SLURM_NTASKS": "1"}
    assert world_from_env(one_task).world_size == 8
    batch = {**SLURM_BATCH, **TORCHRUN, "WORLD_SIZE": "8", "GROUP_WORLD_SIZE": "1"}
    assert world_from_env(batch).world_size == 8
    # an elastic --nnodes=1:2 world (--rdzv-id) restarted on the one node left after the other
    # failed goes on; a --standalone one restarted (after this very refusal) does not
    shrunk = {**standalone, "TORCHELASTIC_RESTART_COUNT": "1", "TORCHELASTIC_RUN_ID": "7"}
    assert world_from_env(shrunk).world_size == 8
    restarted = {**shrunk, "TORCHELASTIC_RUN_ID": "0f3c2b9e-4a1d-4c52-9d7e-2a6b1c8e5f10"}
    with pytest.raises(ValueError, match=r"^this process's torchrun is alone in its rendezvous"):
        world_from_env(restarted)


def test_torchrun_variables_must_be_complete() -> None:
    with pytest.raises(ValueError, match=r"needs both RANK and WORLD_SIZE; WORLD_SIZE missing"):
        world_from_env({"RANK": "0"})
    with pytest.raises(
        ValueError, match=r"launch of 2 processes needs MASTER_ADDR and MASTER_PORT"
    ):
        world_from_env({"RANK": "0", "WORLD_SIZE": "2"})
    with pytest.raises(ValueError, match=r"WORLD_SIZE='two' is not an integer"):
        world_from_env({"RANK": "0", "WORLD_SIZE": "two"})


def test_torchrun_variables_must_describe_a_world() -> None:
    """Set by hand, a rank outside the world waited in the rendezvous until the timeout (a store
    timeout naming a key), and LOCAL_WORLD_SIZE=0 failed rank 0's check with a ZeroDivisionError."""
    seen = "RANK={}, WORLD_SIZE=2, MASTER_ADDR=head, MASTER_PORT=29500"
    for rank in (2, -1):
        env = {"RANK": str(rank), "WORLD_SIZE": "2", "MASTER_ADDR": "head", "MASTER_PORT": "29500"}
        with pytest.raises(ValueError) as err:
            world_from_env(env)
        assert str(err.value) == (
            f"RANK={rank} is not a rank of a world of WORLD_SIZE=2 (expected 0 <= RANK < "
            f"WORLD_SIZE; {seen.format(rank)})"
        )
    with pytest.raises(ValueError, match=r"^RANK=0 is not a rank of a world of WORLD_SIZE=0 "):
        world_from_env({"RANK": "0", "WORLD_SIZE": "0"})
    env = {**TORCHRUN, "LOCAL_WORLD_SIZE": "0"}
    with pytest.raises(ValueError) as err:
        world_from_env(env)
    assert str(err.value) == (
        "LOCAL_WORLD_SIZE=0: the ranks on this host must be at least 1 (RANK=3, WORLD_SIZE=4, "
        "LOCAL_RANK=1, LOCAL_WORLD_SIZE=0, MASTER_ADDR=head, MASTER_PORT=29500)"
    )


def test_same_world_as_submitit(monkeypatch: pytest.MonkeyPatch) -> None:
    """submitit's TorchDistributedEnvironment, the reference for an even layout (not its port)."""
    from submitit.helpers import TorchDistributedEnvironment  # noqa: PLC0415

    for name in TORCHRUN_VARS:
        monkeypatch.delenv(name, raising=False)
    for name, value in {**SLURM_STEP_TASK, "SUBMITIT_EXECUTOR": "slurm"}.items():
        monkeypatch.setenv(name, value)
    ref = TorchDistributedEnvironment()
    world = world_from_env(SLURM_STEP_TASK)
    assert (world.rank, world.world_size, world.local_rank, world.local_world_size) == (
        ref.rank,
        ref.world_size,
        ref.local_rank,
        ref.local_world_size,
    )
    assert world.master_addr == ref.master_addr


@pytest.mark.parametrize(
    ("nodelist", "host"),
    [
        ("n[1-2]", "n1"),
        ("node7,node8", "node7"),
        ("gpu-[003-004,007],cpu1", "gpu-003"),
        ("rack[1-2]-node[01-04],x1", "rack1-node01"),
        ("127.0.0.[1-2]", "127.0.0.1"),
        ("solo", "solo"),
    ],
)
def test_first_host(nodelist: str, host: str) -> None:
    assert first_host(nodelist) == host


@pytest.mark.parametrize("nodelist", ["", "n[", "n]1", ",n1"])
def test_first_host_rejects_malformed_lists(nodelist: str) -> None:
    with pytest.raises(ValueError, match="cannot read the first host of the SLURM node list"):
        first_host(nodelist)


def test_tasks_per_node() -> None:
    assert tasks_per_node("2(x3),1") == [2, 2, 2, 1]
    assert tasks_per_node("8") == [8]
    with pytest.raises(ValueError, match=r"cannot read SLURM tasks per node '2\(3\)'"):
        tasks_per_node("2(3)")


def test_cuda_index() -> None:
    assert cuda_index(3, 8) == 3  # every task sees the node's GPUs
    assert cuda_index(3, 1) == 0  # one GPU bound per task
    with pytest.raises(ValueError, match="local rank 3 has no CUDA device: 2 visible"):
        cuda_index(3, 2)


def test_ranks_without_their_device_fail_every_rank_with_one_message() -> None:
    """What a rank that cannot take its device posts through the store: every rank raises the
    same message, naming the ranks and the first one's problem; no problem, no error."""
    store = dist.HashStore()
    store.set("dmt/runtime/device/1", "local rank 3 has no CUDA device: 2 visible")
    store.set("dmt/runtime/device/2", "local rank 2 has no CUDA device: 2 visible")
    with pytest.raises(ValueError) as err:
        agree_on_devices(store, 0, 3, "")
    assert str(err.value) == (
        "ranks [1, 2] have no device to run on; rank 1: local rank 3 has no CUDA device: 2 visible"
    )
    fine = dist.HashStore()
    fine.set("dmt/runtime/device/1", "")
    agree_on_devices(fine, 0, 2, "")  # every rank has its device: no error


def test_shared_devices_groups_the_ranks_of_one_gpu() -> None:
    """What init_runtime refuses before NCCL's first collective would ("Duplicate GPU
    detected"): two ranks of a host on one GPU (by UUID); distinct GPUs are no clash."""
    devices = ["n1 GPU a", "n1 GPU b", "n2 GPU a", "n1 GPU a", "n2 GPU c", "n2 GPU c"]
    assert shared_devices(devices) == [[0, 3], [4, 5]]
    assert shared_devices(["n1 GPU a", "n1 GPU b", "n2 GPU a"]) == []


def test_ranks_that_chose_different_backends_all_fail_with_the_same_message() -> None:
    """trainer.device=auto on a rank that sees no GPU picks gloo among NCCL ranks; init_runtime
    compares the choices through the rendezvous store before the group, where the gloo rank
    would otherwise wait for its peers until the timeout."""
    store = dist.HashStore()
    store.set("dmt/runtime/backend/1", "nccl on n1")
    store.set("dmt/runtime/backend/2", "nccl on n2")
    with pytest.raises(ValueError) as err:
        agree_on_backend(store, 0, 3, "gloo")
    host = socket.gethostname()
    assert str(err.value) == (
        f"the ranks chose different backends (gloo on ranks [0] ({host}); nccl on ranks [1, 2] "
        "(n1, ...)): with trainer.device=auto a rank picks nccl only where it sees a GPU; make "
        "every rank see its GPU (CUDA_VISIBLE_DEVICES, SLURM --gpus-per-task) or set "
        "trainer.device=cuda or cpu on all of them"
    )
    same = dist.HashStore()
    same.set("dmt/runtime/backend/1", "gloo on n1")
    agree_on_backend(same, 0, 2, "gloo")  # agreed: no error
    assert mixed_backends(["nccl on a", "nccl on b"]) is None


def test_a_restarted_attempt_starts_without_the_failed_attempts_nccl_dump_key(monkeypatch):
    """torchrun's agent store outlives an attempt: NCCL's watchdog of a failed attempt leaves
    its dump key there (unprefixed), which would end the restarted attempt's processes. Rank 0
    deletes it when it meets the store; the other ranks leave the store alone."""
    agent = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", str(agent.port))
    agent.set(_NCCL_DUMP_KEY, "1")
    _elastic_store(2, 1, timedelta(seconds=10))
    assert agent.check([_NCCL_DUMP_KEY])
    _elastic_store(2, 0, timedelta(seconds=10))
    assert not agent.check([_NCCL_DUMP_KEY])


def test_a_busy_rendezvous_port_names_the_port_and_its_formula() -> None:
    """A reproduced bug: rank 0 failing to serve the store on a port another process holds
    (two jobs whose SLURM port formula agrees, on a shared first node) raised torch's bare
    EADDRINUSE, naming neither MASTER_PORT nor where the port came from."""
    import socket  # noqa: PLC0415
    from datetime import timedelta  # noqa: PLC0415

    from dmt.runtime import World, _own_store  # noqa: PLC0415

    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = held.getsockname()[1]
        world = World(0, 2, 0, 2, "127.0.0.1", port, "slurm")
        with pytest.raises(ValueError) as err:
            _own_store(world, timedelta(seconds=5), "job")
    assert str(err.value).startswith(
        f"rank 0 cannot serve the rendezvous store on 127.0.0.1:{port} (MASTER_ADDR:MASTER_PORT; "
        "under SLURM without MASTER_PORT the port is 12000 + (SLURM_JOB_ID + 7919 x "
        "SLURM_STEP_ID) % 20000, which two jobs can share): "
    )
    assert str(err.value).endswith("; set MASTER_PORT to a free port")


def test_uneven_hosts_are_refused_on_every_rank_before_the_group() -> None:
    """SLURM's ``--ntasks 7`` on 4 nodes gives ``2(x3),1``: ranks 0-5 count 2 ranks on their
    host, rank 6 counts 1. SPTT's topology refused it on ranks 0-5 only, and rank 6 went on
    alone until the timeout; now every rank stops before the group, with one message."""
    from dmt.runtime import agree_on_hosts, uneven_hosts  # noqa: PLC0415

    store = dist.HashStore()
    for rank in range(1, 6):
        store.set(f"dmt/runtime/hosts/{rank}", f"2 {rank % 2} on n{rank // 2 + 1}")
    store.set("dmt/runtime/hosts/6", "1 0 on n4")
    with pytest.raises(ValueError) as err:
        agree_on_hosts(store, 0, 7, 2, 0)
    host = socket.gethostname()
    assert str(err.value) == (
        f"the ranks count different numbers of ranks per host (local world size 1 on ranks [6] "
        f"(n4); 2 on ranks [0, 1, 2, 3, 4, 5] ({host}, ...)): TorchRec's plans and SPTT's towers "
        "need the same number on every host; launch as many tasks on each node (SLURM "
        "--ntasks-per-node, torchrun --nproc-per-node, LOCAL_WORLD_SIZE)"
    )
    assert uneven_hosts(["2 0 on a", "2 1 on a", "2 0 on b", "2 1 on b"]) is None


# The tasks of `srun -N2 -n4 --distribution=cyclic` and of `--distribution=arbitrary` with
# SLURM_HOSTFILE listing 127.0.0.2, 127.0.0.1, 127.0.0.1, 127.0.0.2 (SLURM 22.05 on the cluster of
# scripts/slurm_smoke.sh, job 3): (SLURM_PROCID, SLURM_NODEID, SLURM_LOCALID) of each task.
# SLURM_NODEID counts the step's node list in order (127.0.0.2 is node 1 in both).
SLURM_CYCLIC = [(0, 0, 0), (1, 1, 0), (2, 0, 1), (3, 1, 1)]
SLURM_ARBITRARY = [(0, 1, 0), (1, 0, 0), (2, 0, 1), (3, 1, 1)]


def _two_by_two_task(task: int, node: int, local: int) -> dict[str, str]:
    return {
        **SLURM_STEP_TASK,
        "SLURM_JOB_ID": "3",
        "SLURM_PROCID": str(task),
        "SLURM_NODEID": str(node),
        "SLURM_LOCALID": str(local),
        "SLURM_NTASKS": "4",
        "SLURM_STEP_NUM_TASKS": "4",
        "SLURM_NTASKS_PER_NODE": "2",
        "SLURM_STEP_TASKS_PER_NODE": "2(x2)",
        "SLURM_TASKS_PER_NODE": "2(x2)",
        "SLURM_STEP_NODELIST": "127.0.0.[1-2]",
        "SLURM_JOB_NODELIST": "127.0.0.[1-2]",
    }


@pytest.mark.parametrize("tasks", [SLURM_CYCLIC, SLURM_ARBITRARY], ids=["cyclic", "arbitrary"])
def test_slurm_ranks_are_numbered_node_by_node_whatever_the_distribution(
    tasks: list[tuple[int, int, int]],
) -> None:
    """Under cyclic placement SLURM_PROCID 1 runs on the second node: as the rank it made
    ranks 0 and 1 one "host" on two nodes. Under arbitrary placement task 0 runs on node 1, away
    from the rendezvous host (the first of the node list), where the others waited for it."""
    worlds = {
        task: world_from_env(_two_by_two_task(task, node, local)) for task, node, local in tasks
    }
    by_rank = sorted(worlds.values(), key=lambda w: w.rank)
    assert [w.rank for w in by_rank] == [0, 1, 2, 3]
    for world in by_rank:
        assert world.slurm_node == world.rank // 2  # consecutive ranks share a node
        assert world.local_rank == world.rank % 2
        assert (world.world_size, world.local_world_size) == (4, 2)
        assert world.master_addr == "127.0.0.1"  # node 0's, where rank 0 runs
    assert by_rank[0].slurm_node == 0
    assert [w.slurm_task for w in by_rank] == (
        [0, 2, 1, 3] if tasks is SLURM_CYCLIC else [1, 2, 0, 3]
    )


def test_slurm_block_distribution_keeps_slurm_procid_as_the_rank() -> None:
    for task in range(4):
        world = world_from_env(_two_by_two_task(task, task // 2, task % 2))
        assert (world.rank, world.slurm_task) == (task, task)
    # 7 tasks laid out 2,2,2,1 by blocks: node 3's task is task 6
    world = world_from_env(
        {
            **_two_by_two_task(6, 3, 0),
            "SLURM_STEP_TASKS_PER_NODE": "2(x3),1",
            "SLURM_NTASKS": "7",
            "SLURM_STEP_NUM_TASKS": "7",
        }  # fmt: skip
    )
    assert (world.rank, world.local_world_size) == (6, 1)


def test_slurm_node_id_is_needed_where_it_decides_the_rank() -> None:
    """It numbers the ranks: without it every node's tasks took the first node's ranks."""
    env = _two_by_two_task(2, 1, 0)
    del env["SLURM_NODEID"]
    with pytest.raises(ValueError, match=r"^environment variable SLURM_NODEID is not set \("):
        world_from_env(env)
    # one node: node 0
    one = {**env, "SLURM_STEP_TASKS_PER_NODE": "4", "SLURM_NTASKS_PER_NODE": "4",
           "SLURM_PROCID": "3", "SLURM_LOCALID": "3"}  # fmt: skip
    assert world_from_env(one).rank == 3


def test_slurm_local_id_outside_its_node_is_refused() -> None:
    with pytest.raises(ValueError, match=r"^SLURM_LOCALID=2 on node SLURM_NODEID=1 does not fit "
                       r"the step's 4 tasks, 2 on this node \("):  # fmt: skip
        world_from_env(_two_by_two_task(3, 1, 2))


def test_hand_set_world_without_local_variables_counts_one_host_numbered_by_rank() -> None:
    env = {"RANK": "3", "WORLD_SIZE": "4", "MASTER_ADDR": "h", "MASTER_PORT": "1"}
    world = world_from_env(env)
    assert (world.local_rank, world.local_world_size) == (3, 4)
    # LOCAL_WORLD_SIZE without LOCAL_RANK: its place on its host as torchrun would number it
    world = world_from_env({**env, "LOCAL_WORLD_SIZE": "2"})
    assert (world.local_rank, world.local_world_size) == (1, 2)


def test_ranks_numbered_across_hosts_are_refused_on_every_rank_before_the_group() -> None:
    """A hand-set world of 4 (RANK, WORLD_SIZE, MASTER_*) on two machines without
    LOCAL_WORLD_SIZE: every rank took all 4 for its host, and SPTT's towers spanned both
    machines. Now every rank stops before the group with one message."""
    from dmt.runtime import agree_on_hosts, misplaced_ranks  # noqa: PLC0415

    store = dist.HashStore()
    host = socket.gethostname()
    for rank in range(1, 4):
        store.set(f"dmt/runtime/hosts/{rank}", f"4 {rank} on {host if rank < 2 else 'other'}")
    with pytest.raises(ValueError) as err:
        agree_on_hosts(store, 0, 4, 4, 0)
    assert str(err.value) == (
        f"ranks 0-3 should be local ranks 0-3 of one host (4 ranks per host, numbered host by "
        f"host: TorchRec's plans and SPTT's towers assume it), but rank 0 is local rank 0 on "
        f"{host}, rank 1 is local rank 1 on {host}, rank 2 is local rank 2 on other, rank 3 is "
        "local rank 3 on other; launch with torchrun or srun, which number them so, or, setting "
        "the variables by hand, give every process LOCAL_WORLD_SIZE (the ranks on its host), "
        "LOCAL_RANK, and RANK = host index x LOCAL_WORLD_SIZE + LOCAL_RANK"
    )
    # torchrun's numbering; hosts emulated on one machine share its name
    assert misplaced_ranks(["2 0 on a", "2 1 on a", "2 0 on b", "2 1 on b"]) is None
    assert misplaced_ranks(["2 0 on a", "2 1 on a", "2 0 on a", "2 1 on a"]) is None
    # cyclic numbering: ranks 0 and 1 on two machines
    assert misplaced_ranks(["2 0 on a", "2 0 on b", "2 1 on a", "2 1 on b"]) == (
        "ranks 0-1 should be local ranks 0-1 of one host (2 ranks per host, numbered host by "
        "host: TorchRec's plans and SPTT's towers assume it), but rank 0 is local rank 0 on a, "
        "rank 1 is local rank 0 on b; launch with torchrun or srun, which number them so, or, "
        "setting the variables by hand, give every process LOCAL_WORLD_SIZE (the ranks on its "
        "host), LOCAL_RANK, and RANK = host index x LOCAL_WORLD_SIZE + LOCAL_RANK"
    )
    # local ranks out of order on one machine (LOCAL_RANK set by hand)
    assert misplaced_ranks(["2 1 on a", "2 0 on a"]) is not None
    assert misplaced_ranks(["2 0 on a", "2 1 on a", "2 0 on b"]) == (
        "a world of 3 ranks is not a whole number of hosts of 2 ranks (LOCAL_WORLD_SIZE=2)"
    )
