"""What the configuration dataclasses (`FlowConfig`, `TrainConfig`) share: a round trip
through a plain dict, as saved in a head's config.json and in a checkpoint."""

from __future__ import annotations

from dataclasses import asdict, fields
from typing import Any, ClassVar, TypeVar

from .errors import BertflowError

__all__ = ["DictConfig"]

C = TypeVar("C", bound="DictConfig")


class DictConfig:
    """A dataclass of settings saved as a dict; reading one refuses keys it does not know,
    named as `KIND` keys ("unknown flow config keys: ...")."""

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
