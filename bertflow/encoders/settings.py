"""An encoder folder's own sentence-transformers settings: the pooling its `modules.json` names
and the max length of its `sentence_bert_config.json`, the defaults where none is given."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = ["FolderSettings", "read_settings"]

# sentence-transformers' Pooling modes (its 1_Pooling/config.json) that are bertflow poolings
_MODES = {"pooling_mode_cls_token": "cls", "pooling_mode_mean_tokens": "mean"}
_OTHER_MODES = ("pooling_mode_max_tokens", "pooling_mode_mean_sqrt_len_tokens",
                "pooling_mode_weightedmean_tokens", "pooling_mode_lasttoken")
_LARGEST = 1 << 20  # bytes: a settings file is a few hundred; a larger one is not read


@dataclass(frozen=True)
class FolderSettings:
    """What an encoder folder says of its own use: `pooling` (a bertflow pooling) and
    `max_length`, each None where it says nothing usable; `unused` why a setting it has is not
    taken (another pooling, a malformed file), or None."""

    pooling: str | None = None
    max_length: int | None = None
    unused: str | None = None


def read_settings(folder: str | os.PathLike) -> FolderSettings:
    """The settings of the sentence-transformers model in `folder`, read as JSON alone (no
    module of the folder is imported): its Pooling module's mode where it is CLS or mean, and
    `max_seq_length`. A folder without them has none."""
    folder = Path(folder)
    unused, pooling = [], None
    modules = _read(folder / "modules.json", list)
    if modules is False:
        unused.append("its modules.json is malformed")
    for module in modules or []:
        path = module.get("path") if isinstance(module, dict) else None
        if not (isinstance(path, str) and str(module.get("type", "")).endswith("Pooling")):
            continue
        if Path(path).is_absolute() or ".." in Path(path).parts:
            unused.append(f"its Pooling module lies outside it ({path})")
            break
        config = _read(folder / path / "config.json", dict)
        modes = [k for k in (*_MODES, *_OTHER_MODES) if (config or {}).get(k) is True]
        if len(modes) == 1 and modes[0] in _MODES:
            pooling = _MODES[modes[0]]
        else:
            unused.append(f"its Pooling module's {' and '.join(m[13:] for m in modes)} mode is "
                          "not one of bertflow's poolings" if modes else
                          f"its Pooling module's {path or '.'}/config.json names no mode")
        break
    length = (_read(folder / "sentence_bert_config.json", dict) or {}).get("max_seq_length")
    if not isinstance(length, int) or isinstance(length, bool) or length < 2:
        length = None
    return FolderSettings(pooling, length, "; ".join(unused) or None)


def _read(path: Path, kind: type) -> Any:
    """The JSON value of `path` if it is a `kind`; None where there is no such file, False
    where it is unreadable, too large or not a `kind`."""
    if not path.is_file():
        return None
    try:
        if path.stat().st_size > _LARGEST:
            return False
        value = json.loads(path.read_bytes().decode("utf-8"))
    except (OSError, UnicodeDecodeError, ValueError):
        return False
    return value if isinstance(value, kind) else False
