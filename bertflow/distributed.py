"""The processes a command runs in (under `torchrun`; else one) and each one's threads."""

from __future__ import annotations

import datetime
import gc
import math
import os
from pathlib import Path

import torch
import torch.distributed as dist

__all__ = ["available_cpus", "barrier", "broadcast_error", "init", "is_main", "join", "launched",
           "leave", "local_device", "rank", "use_available_cpus", "world_size"]

_TIMEOUT = datetime.timedelta(hours=6)  # a rank may wait that long for a slower shard


def launched() -> bool:
    """Whether this process was started by torchrun as one of several."""
    return int(os.environ.get("WORLD_SIZE", "1")) > 1


def init(device: torch.device) -> None:
    """Join torchrun's process group, once; on CUDA, CPU tensors still go through gloo."""
    if not launched() or dist.is_initialized():
        return
    backend = "cpu:gloo,cuda:nccl" if device.type == "cuda" else "gloo"
    if device.type == "cuda":
        torch.cuda.set_device(device)
    dist.init_process_group(backend, timeout=_TIMEOUT)


def join(device: str) -> str:
    """Join torchrun's job on this process's own `device` (a kind): the one used."""
    from .encoder import resolve_device

    chosen = local_device(resolve_device(device))
    init(chosen)
    return str(chosen)


def local_device(device: torch.device) -> torch.device:
    """Under torchrun, `cuda` means this process's own GPU, `cuda:LOCAL_RANK`."""
    if device.type == "cuda" and device.index is None and launched():
        return torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
    return device


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
    """The CPUs of this process's affinity, capped by the quota of the cgroup at `cgroup`."""
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    quotas = [math.ceil(q) for q in map(_quota, (cgroup, cgroup / "cpu")) if q > 0]
    return max(1, min([cpus or 1, *quotas]))


def _quota(folder: Path) -> float:
    """The CPUs of a cgroup's quota (v2 or v1); 0 or less if none is set."""
    try:
        if (folder / "cpu.max").is_file():
            quota, period = (folder / "cpu.max").read_text().split()[:2]
        else:
            quota, period = ((folder / f"cpu.cfs_{n}_us").read_text() for n in ("quota", "period"))
        return int(quota) / int(period)
    except (OSError, ValueError, ZeroDivisionError):
        return 0
