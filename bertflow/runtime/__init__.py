"""Where the code runs: devices and precision, processes under torchrun and their threads."""

from ..lazy import exports

__all__, __getattr__, __dir__ = exports(__name__, {
    "devices": ("resolve_device", "resolve_dtype"),
    "distributed": ("available_cpus", "barrier", "broadcast_error", "is_main", "join", "launched",
                    "leave", "rank", "use_available_cpus", "world_size"),
})
