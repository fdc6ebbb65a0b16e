"""How bytes reach disk and come back: atomic writes and checks, artifact folders, text and
corpus readers, tables read by rows."""

from ..lazy import exports

__all__, __getattr__, __dir__ = exports(__name__, (
    "artifacts", "corpus", "files", "jsonl", "rows",
))
