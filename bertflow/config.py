"""What `FlowConfig` and `TrainConfig` share: a round trip through the dict a head or checkpoint
saves; and a flow's ceilings, which the command line checks without importing torch."""

from __future__ import annotations

from dataclasses import asdict, fields
from typing import Any, ClassVar, TypeVar

from .errors import BertflowError

__all__ = ["FLOW_CEILINGS", "MAX_FLOW_PARAMETERS", "DictConfig"]

C = TypeVar("C", bound="DictConfig")

# A flow's largest levels, depth (steps per level), hidden (conditioner width) and parameter
# count (1 GiB of float32 weights; training holds four times that).
FLOW_CEILINGS = {"levels": 16, "depth": 256, "hidden": 16384}
MAX_FLOW_PARAMETERS = 2**28


class DictConfig:
    """A dataclass of settings saved as a dict; reading one refuses unknown `KIND` keys."""

    KIND: ClassVar[str] = "config"

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)  # type: ignore[call-overload]

    @classmethod
    def from_dict(cls: type[C], value: dict[str, Any]) -> C:
        names = {f.name for f in fields(cls)}  # type: ignore[arg-type]
        unknown = set(value) - names
        if unknown:
            raise BertflowError(f"unknown {cls.KIND} keys: {', '.join(sorted(unknown))}")
        return cls(**value)
