"""Several processes, on one machine or several, started by PyTorch's `torchrun`.

bertflow never launches processes itself: under `torchrun` (which sets `RANK`, `WORLD_SIZE`,
`LOCAL_RANK` and the rendezvous), `init` joins the process group, with gloo on the CPU and
NCCL on CUDA; without it every helper here is the one-process case.
"""

from __future__ import annotations

import datetime
import os

import torch
import torch.distributed as dist

__all__ = ["barrier", "broadcast_error", "init", "is_main", "join", "launched", "leave",
           "local_device", "rank", "world_size"]

_TIMEOUT = datetime.timedelta(hours=6)  # a rank may wait that long for a slower shard


def launched() -> bool:
    """Whether this process was started by torchrun as one of several."""
    return int(os.environ.get("WORLD_SIZE", "1")) > 1


def init(device: torch.device) -> None:
    """Join the process group torchrun describes (no-op when not launched, or joined). On CUDA,
    collectives of CUDA tensors go through NCCL and those of CPU tensors (the flow's gradients,
    which train on the CPU, and the messages between processes) through gloo."""
    if not launched() or dist.is_initialized():
        return
    backend = "cpu:gloo,cuda:nccl" if device.type == "cuda" else "gloo"
    if device.type == "cuda":
        torch.cuda.set_device(device)
    dist.init_process_group(backend, timeout=_TIMEOUT)


def join(device: str) -> str:
    """Join the job torchrun describes on this process's own device of kind `device` (``auto``,
    ``cpu``, ``cuda``, ``cuda:N``): the device it uses."""
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
    """Leave the process group, if this process joined one."""
    if dist.is_initialized():
        dist.destroy_process_group()


def barrier() -> None:
    if dist.is_initialized():
        dist.barrier()


def broadcast_error(message: str | None) -> str | None:
    """Rank 0's error message (or None) on every rank, so that all of them stop together."""
    if not dist.is_initialized():
        return message
    box = [message]
    dist.broadcast_object_list(box, src=0)
    return box[0]
