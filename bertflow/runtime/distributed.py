"""The processes a command runs in (under `torchrun`; else one) and each one's threads."""

from __future__ import annotations

import contextlib
import datetime
import gc
import math
import os
from pathlib import Path

import torch
import torch.distributed as dist

from .devices import resolve_device

__all__ = ["available_cpus", "barrier", "broadcast_error", "is_main", "join", "launched", "leave",
           "rank", "use_available_cpus", "world_size"]

_TIMEOUT = datetime.timedelta(hours=6)  # a rank may wait that long for a slower shard


def launched() -> bool:
    """Whether this process was started by torchrun as one of several."""
    return int(os.environ.get("WORLD_SIZE", "1")) > 1


def join(device: str | torch.device) -> str:
    """Join torchrun's job, once, on this process's own `device` (`cuda` there means
    `cuda:LOCAL_RANK`): the device used. On CUDA, CPU tensors still go through gloo."""
    chosen = resolve_device(device)
    if launched() and chosen.type == "cuda" and chosen.index is None:
        chosen = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
    if launched() and not dist.is_initialized():
        if chosen.type == "cuda":
            torch.cuda.set_device(chosen)
        backend = "cpu:gloo,cuda:nccl" if chosen.type == "cuda" else "gloo"
        dist.init_process_group(backend, timeout=_TIMEOUT)
    return str(chosen)


def rank() -> int:
    return dist.get_rank() if dist.is_initialized() else 0


def world_size() -> int:
    return dist.get_world_size() if dist.is_initialized() else 1


def is_main() -> bool:
    return rank() == 0


def leave() -> None:
    if dist.is_initialized():
        dist.destroy_process_group()
        gc.collect()  # what still holds the group's work goes while the interpreter is whole


def barrier() -> None:
    if dist.is_initialized():
        dist.barrier()


def broadcast_error(message: str | None) -> str | None:
    """Rank 0's error message (or None) on every rank, so that all stop together."""
    if not dist.is_initialized():
        return message
    box = [message]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def use_available_cpus() -> int | None:
    """Give torch a thread per CPU this process may use (its default, every CPU of the machine,
    is slow on a busy one), unless OMP or MKL_NUM_THREADS is set: the count or None."""
    if os.environ.get("OMP_NUM_THREADS") or os.environ.get("MKL_NUM_THREADS"):
        return None
    threads = available_cpus()
    torch.set_num_threads(threads)
    return threads


def available_cpus(cgroup: Path = Path("/sys/fs/cgroup")) -> int:
    """The CPUs of this process's affinity, capped by the quota of the cgroup at `cgroup` (v2's
    cpu.max, else v1's cpu/cpu.cfs_quota_us; none set, or -1 or max, is no cap)."""
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    limits = [cpus or 1]
    for folder in (cgroup, cgroup / "cpu"):
        with contextlib.suppress(OSError, ValueError, ZeroDivisionError):
            if (folder / "cpu.max").is_file():
                quota, period = (folder / "cpu.max").read_text().split()[:2]
            else:
                names = ("cpu.cfs_quota_us", "cpu.cfs_period_us")
                quota, period = ((folder / name).read_text() for name in names)
            share = int(quota) / int(period)
            if share > 0:
                limits.append(math.ceil(share))
    return max(1, min(limits))
