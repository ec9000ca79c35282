"""Free host memory from ``/proc`` and the memory cgroups, and the staging verdict
(:mod:`dmt.host_memory`), on planted ``/proc`` and ``/sys/fs/cgroup`` trees and on this machine."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from dmt.host_memory import (
    RankMemory,
    available_bytes,
    machine_id,
    memory_bounds,
    staging_shortfall,
)

GIB = 1024**3


def _tree(root: Path, cgroup: str, meminfo_gib: float, files: dict[str, str]) -> Path:
    (root / "proc" / "self").mkdir(parents=True)
    (root / "proc" / "meminfo").write_text(
        f"MemTotal:       99999999 kB\nMemAvailable:   {int(meminfo_gib * 1024**2)} kB\n"
    )
    (root / "proc" / "self" / "cgroup").write_text(cgroup)
    for rel, text in files.items():
        f = root / "sys" / "fs" / "cgroup" / rel
        f.parent.mkdir(parents=True, exist_ok=True)
        f.write_text(text)
    return root


def test_cgroup_v2_limit_of_an_ancestor_bounds_what_is_free(tmp_path):
    """SLURM's ConstrainRAMSpace limits the job's cgroup; the process sits in its step's, below.
    Headroom: limit - usage + inactive page cache (reclaimed before an OOM kill)."""
    job = "slurm/uid_0/job_7"
    root = _tree(
        tmp_path,
        "0::/slurm/uid_0/job_7/step_0\n",
        meminfo_gib=100,
        files={
            f"{job}/memory.max": f"{8 * GIB}\n",
            f"{job}/memory.current": f"{6 * GIB}\n",
            # the page cache of a memory-mapped dataset, mostly on the active list
            f"{job}/memory.stat": f"anon {GIB}\ninactive_file {GIB}\nactive_file {3 * GIB}\n",
            f"{job}/step_0/memory.max": "max\n",
            f"{job}/step_0/memory.current": f"{6 * GIB}\n",
            "memory.max": "max\n",  # the root's (unlimited)
        },
    )
    assert available_bytes(root) == 6 * GIB  # 8 - 6 + 1 + 3


def test_cgroup_v1_limit_and_the_unlimited_value_it_reports(tmp_path):
    leaf = "memory/process_api/abc"
    root = _tree(
        tmp_path,
        "9:name=systemd:/\n4:memory:/process_api/abc\n0::/\n",
        meminfo_gib=2,
        files={
            f"{leaf}/memory.limit_in_bytes": f"{10 * GIB}\n",
            f"{leaf}/memory.usage_in_bytes": f"{9 * GIB}\n",
            f"{leaf}/memory.stat": (
                f"cache 5\ntotal_inactive_file {GIB // 4}\ntotal_active_file {GIB // 4}\n"
            ),
            # v1's "no limit" (2^63 rounded down to a page) at the parent and the root
            "memory/process_api/memory.limit_in_bytes": "9223372036854771712\n",
            "memory/process_api/memory.usage_in_bytes": f"{20 * GIB}\n",
            "memory/memory.limit_in_bytes": "9223372036854771712\n",
            "memory/memory.usage_in_bytes": f"{20 * GIB}\n",
        },
    )
    assert available_bytes(root) == 3 * GIB // 2  # the cgroup's 1.5 GiB, under MemAvailable's 2
    (root / "sys/fs/cgroup" / leaf / "memory.limit_in_bytes").write_text("9223372036854771712\n")
    assert available_bytes(root) == 2 * GIB  # no limit anywhere: the host's MemAvailable


def test_without_cgroup_files_the_hosts_memavailable(tmp_path):
    root = _tree(tmp_path, "0::/user.slice/session-1.scope\n", meminfo_gib=5, files={})
    assert available_bytes(root) == 5 * GIB
    (root / "proc" / "self" / "cgroup").unlink()
    assert available_bytes(root) == 5 * GIB


def test_this_machines_free_memory_is_within_its_total():
    total = next(
        int(line.split()[1]) * 1024
        for line in Path("/proc/meminfo").read_text().splitlines()
        if line.startswith("MemTotal:")
    )
    assert 0 < available_bytes() <= total


def _rank(machine, host, staged_gib, host_free_gib=None, **cgroups_gib):
    bounds = {} if host_free_gib is None else {"host": host_free_gib * GIB}
    bounds |= {f"cgroup {k}": v * GIB for k, v in cgroups_gib.items()}
    return RankMemory(machine, host, staged_gib * GIB, bounds)


def test_a_machines_free_memory_holds_all_its_ranks_copies():
    fits = [_rank("m1", "a", 3, 10), _rank("m1", "a", 3, 7)]
    assert staging_shortfall(fits) is None
    ranks = [*fits, _rank("m2", "b", 2, 100), _rank("m2", "b", 2, 3)]  # m2: 4 GiB into 3
    assert staging_shortfall(ranks) == (
        "host b (ranks 2, 3) would stage 4 GiB of checkpoint state in host memory with 3 GiB free"
    )
    tiny = RankMemory("m3", "c", 2048, {"host": 1024})
    assert staging_shortfall([tiny]) == (
        "host c (rank 0) would stage 2048 bytes of checkpoint state in host memory with "
        "1024 bytes free"
    )
    # two pods of one node, each its own host name: one machine, one MemAvailable
    pods = [_rank("m4", "pod-0", 3, 5), _rank("m4", "pod-1", 3, 5)]
    assert staging_shortfall(pods) == (
        "host pod-0 / pod-1 (ranks 0, 1) would stage 6 GiB of checkpoint state in host memory "
        "with 5 GiB free"
    )
    # two nodes under one host name (host networking): two machines, each fits
    assert staging_shortfall([_rank("m5", "n", 3, 5), _rank("m6", "n", 3, 5)]) is None


def test_a_cgroup_holds_the_copies_of_the_ranks_inside_it_only():
    """8 pods on a 1 TiB node, each limited to 80 GiB free, each staging 60 GiB: every limit
    holds its own rank's copy, the node all eight."""
    pods = [_rank("m", f"pod-{i}", 60, 1000, **{f"pod{i}": 80}) for i in range(8)]
    assert staging_shortfall(pods) is None
    # two ranks in one job cgroup (SLURM): its limit holds both copies
    job = [_rank("m", "n", 60, 1000, job=100), _rank("m", "n", 60, 1000, job=100)]
    assert staging_shortfall(job) == (
        "host n (ranks 0, 1) would stage 120 GiB of checkpoint state in host memory with "
        "100 GiB free under their memory cgroup's limit"
    )
    # the node runs short before the pods' limits do
    # (8 x 60 = 480 GiB on the node's 400, each pod's 60 within its own 80)
    crowded = [_rank("m", f"pod-{i}", 60, 400, **{f"pod{i}": 80}) for i in range(8)]
    assert staging_shortfall(crowded) == (
        "host pod-0 / pod-1 / pod-2 / pod-3 / pod-4 / pod-5 / pod-6 / pod-7 (ranks 0, 1, 2, 3, 4, "
        "5, 6, 7) would stage 480 GiB of checkpoint state in host memory with 400 GiB free"
    )


def test_a_rank_that_cannot_read_its_memory_is_judged_by_its_neighbours_only():
    assert staging_shortfall([RankMemory("m7", "d", 3 * GIB, None)]) is None
    unread = [RankMemory("m7", "d", 3 * GIB, None), _rank("m7", "d", 3, 4)]
    assert staging_shortfall(unread) == (
        "host d (ranks 0, 1) would stage 6 GiB of checkpoint state in host memory with 4 GiB free"
    )


def test_the_bounds_name_the_host_and_each_limited_cgroup(tmp_path):
    job = "slurm/job_7"
    root = _tree(
        tmp_path,
        "0::/slurm/job_7/step_0\n",
        meminfo_gib=100,
        files={
            f"{job}/memory.max": f"{8 * GIB}\n",
            f"{job}/memory.current": f"{6 * GIB}\n",
            f"{job}/step_0/memory.max": f"{50 * GIB}\n",
            f"{job}/step_0/memory.current": f"{5 * GIB}\n",
        },
    )
    inode = {
        d: f"cgroup {(root / 'sys/fs/cgroup' / d).stat().st_dev}:"
        f"{(root / 'sys/fs/cgroup' / d).stat().st_ino}"
        for d in (job, f"{job}/step_0")
    }
    assert memory_bounds(root) == {
        "host": 100 * GIB,
        inode[f"{job}/step_0"]: 45 * GIB,
        inode[job]: 2 * GIB,
    }
    assert available_bytes(root) == 2 * GIB


def test_a_container_sees_its_own_limit_at_the_base_and_bad_lines_are_skipped(tmp_path):
    """cgroup v2 with a cgroup namespace: the process's cgroup is "/" and its limit sits at the
    mount's root; a malformed line and a ".." path read nothing outside the hierarchy."""
    root = _tree(
        tmp_path,
        "garbage\n0::/\n0::/../..\n",
        meminfo_gib=100,
        files={
            "memory.max": f"{16 * GIB}\n",
            "memory.current": f"{4 * GIB}\n",
            "memory.stat": "inactive_file 0\nactive_file 0\n",
        },
    )
    assert available_bytes(root) == 12 * GIB


def test_the_machine_id_is_the_boot_id(tmp_path):
    assert machine_id() == Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    assert machine_id(tmp_path) == socket.gethostname()  # unreadable: the host name


@pytest.mark.parametrize("text", ["MemTotal: 5 kB\n", ""])
def test_a_meminfo_without_memavailable_is_an_error_naming_the_file(tmp_path, text):
    root = _tree(tmp_path, "0::/\n", meminfo_gib=1, files={})
    (root / "proc" / "meminfo").write_text(text)
    with pytest.raises(ValueError, match=f"^{root / 'proc' / 'meminfo'} has no MemAvailable line$"):
        available_bytes(root)


def _mountinfo(root: Path, *mounts: tuple[str, str, str, str]) -> None:
    """``/proc/self/mountinfo`` lines for (cgroup at the mount's root, mount point, fstype,
    super options)."""
    lines = [
        f"{30 + i} 23 0:{40 + i} {cgroup} {point} rw,relatime - {fstype} {fstype} {options}"
        for i, (cgroup, point, fstype, options) in enumerate(mounts)
    ]
    (root / "proc" / "self" / "mountinfo").write_text("\n".join(lines) + "\n")


def _limit(root: Path, where: str, files: tuple[str, str], limit: int, usage: int) -> None:
    d = root / where
    d.mkdir(parents=True, exist_ok=True)
    (d / files[0]).write_text(f"{limit}\n")
    (d / files[1]).write_text(f"{usage}\n")


def test_the_hierarchies_are_read_where_mountinfo_says_they_are_mounted(tmp_path):
    """cgroup v2 mounted outside /sys/fs/cgroup (here /cgroup2, its name escaped as the kernel
    writes it) was not read; a hybrid host's v1 memory controller is read beside it; a mount
    showing a part of the hierarchy (a container's bind mount, cgroup root /docker/abc) maps
    the process's cgroup below that part; a mount of another part is skipped."""
    root = _tree(tmp_path, "4:memory:/docker/abc\n0::/slurm/job_7/step_0\n", 100, files={})
    _mountinfo(
        root,
        ("/", "/sys/fs/cgroup", "tmpfs", "rw,mode=755"),
        ("/", "/sys/fs/cgroup/cpu", "cgroup", "rw,cpu"),
        ("/docker/abc", "/sys/fs/cgroup/memory", "cgroup", "rw,memory"),
        ("/", "/my\\040cgroup2", "cgroup2", "rw"),
        ("/other", "/elsewhere", "cgroup2", "rw"),
    )
    v2 = ("memory.max", "memory.current")
    _limit(root, "my cgroup2/slurm/job_7", v2, 8 * GIB, 5 * GIB)
    _limit(root, "elsewhere", v2, GIB, GIB)  # another part of the hierarchy: not ours
    assert available_bytes(root) == 3 * GIB  # the v2 job's limit (8 - 5)
    v1 = ("memory.limit_in_bytes", "memory.usage_in_bytes")
    _limit(root, "sys/fs/cgroup/memory", v1, 4 * GIB, 2 * GIB)  # the container's cgroup
    _limit(root, "sys/fs/cgroup/cpu", v1, GIB, GIB)  # not the memory controller's: not read
    bounds = memory_bounds(root)
    assert sorted(bounds.values()) == [2 * GIB, 3 * GIB, 100 * GIB]
    # without mountinfo, where they usually are: v2 at /sys/fs/cgroup (nothing there), v1's
    # /docker/abc is not below /sys/fs/cgroup/memory, whose own limit is its nearest ancestor
    (root / "proc" / "self" / "mountinfo").unlink()
    container = (root / "sys/fs/cgroup/memory").stat()
    assert memory_bounds(root) == {
        "host": 100 * GIB,
        f"cgroup {container.st_dev}:{container.st_ino}": 2 * GIB,
    }
