"""An encoder folder's own sentence-transformers settings: the pooling its `modules.json` names
and the max length of its `sentence_bert_config.json`, the defaults where none is given."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = ["FolderSettings", "read_settings"]

# sentence-transformers' Pooling modes (its 1_Pooling/config.json: `pooling_mode` since its
# version 6, a flag per mode before) that are bertflow poolings
_MODES = {"cls": "cls", "mean": "mean"}
_FLAGS = {"pooling_mode_cls_token": "cls", "pooling_mode_mean_tokens": "mean",
          "pooling_mode_max_tokens": "max", "pooling_mode_mean_sqrt_len_tokens": "mean_sqrt_len",
          "pooling_mode_weightedmean_tokens": "weightedmean", "pooling_mode_lasttoken": "lasttoken"}
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
        modes = _modes(_read(folder / path / "config.json", dict) or {})
        if len(modes) == 1 and modes[0] in _MODES:
            pooling = _MODES[modes[0]]
        else:
            unused.append(f"its Pooling module's {' and '.join(modes)} mode is not one of "
                          "bertflow's poolings" if modes else
                          f"its Pooling module's {path or '.'}/config.json names no mode")
        break
    # sentence-transformers 6 keeps the length in the tokenizer's config, older ones beside it
    length = (_read(folder / "sentence_bert_config.json", dict) or {}).get("max_seq_length")
    if length is None and modules:
        length = (_read(folder / "tokenizer_config.json", dict) or {}).get("model_max_length")
    if not isinstance(length, int) or isinstance(length, bool) or not 2 <= length < 1_000_000:
        length = None
    return FolderSettings(pooling, length, "; ".join(unused) or None)


def _modes(config: dict[str, Any]) -> list[str]:
    """The pooling modes a Pooling module's config sets: its `pooling_mode` (a name or a list
    of names), else its flags, where none is set the mean, as sentence-transformers reads it."""
    mode = config.get("pooling_mode")
    if isinstance(mode, str):
        return [mode]
    if isinstance(mode, list) and all(isinstance(m, str) for m in mode):
        return list(mode)
    if any(flag in config for flag in _FLAGS):
        return [name for flag, name in _FLAGS.items() if config.get(flag) is True] or ["mean"]
    return []


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
