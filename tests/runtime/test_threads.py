import os

import pytest
import torch

from bertflow.runtime import distributed
from bertflow.runtime.distributed import available_cpus, use_available_cpus


@pytest.mark.parametrize("files, cpus", [
    ({}, 8),  # no cgroup files: the affinity
    ({"cpu.max": "max 100000\n"}, 8),
    ({"cpu.max": "150000 100000\n"}, 2),  # 1.5 CPUs, rounded up
    ({"cpu.max": "50000 100000\n"}, 1),
    ({"cpu.max": "1600000 100000\n"}, 8),  # the affinity is lower
    ({"cpu/cpu.cfs_quota_us": "-1\n", "cpu/cpu.cfs_period_us": "100000\n"}, 8),  # cgroup v1
    ({"cpu/cpu.cfs_quota_us": "400000\n", "cpu/cpu.cfs_period_us": "100000\n"}, 4),
])
def test_available_cpus_are_the_affinity_capped_by_the_cgroup_quota(tmp_path, monkeypatch,
                                                                    files, cpus):
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(8)))
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    assert available_cpus(tmp_path) == cpus


def test_threads_follow_the_cpus_unless_the_user_set_them(monkeypatch):
    calls = []
    monkeypatch.setattr(torch, "set_num_threads", calls.append)
    monkeypatch.setattr(distributed, "available_cpus", lambda: 3)
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    assert use_available_cpus() is None and calls == []
    monkeypatch.delenv("OMP_NUM_THREADS")
    monkeypatch.delenv("MKL_NUM_THREADS", raising=False)
    assert use_available_cpus() == 3 and calls == [3]


def test_the_command_line_sets_the_threads_before_any_work(monkeypatch, tmp_path):
    from bertflow.cli.main import main

    calls = []
    monkeypatch.setattr(distributed, "use_available_cpus", lambda: calls.append(1))
    assert main(["encode", str(tmp_path / "missing.txt"), "--out", str(tmp_path / "x.npy")]) == 1
    assert calls == []  # a slip in the command fails first
    assert main(["recipes"]) == 0 and calls == []  # computes nothing: torch is not imported
    assert main(["search", "--index", str(tmp_path), "--query", "a"]) == 1 and calls == [1]
