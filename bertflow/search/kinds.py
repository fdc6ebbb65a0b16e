"""The kinds of FAISS index an `Index` holds: `flat` (exact), `hnsw`, or any FAISS
`index_factory` string (`IVF1024,PQ32`, `OPQ32,IVF1024,PQ32`, `PCA64,Flat`, `HNSW32`, ...),
each behind an optional PCA and an L2 normalisation (and another after a string's own vector
transforms), searched by inner product (cosine); how many vectors a kind is trained on, its
inverted lists' `nprobe`, its HNSW graph's `M`, `efConstruction` and `efSearch`, and the
structure a saved index must have."""

from __future__ import annotations

import math
import os
import re
from typing import Any

import numpy as np

from ..constants import HNSW_DEFAULTS
from ..errors import BertflowError, first_line

__all__ = ["HNSW_DEFAULTS", "KINDS", "MAX_BITS", "MAX_NEIGHBOURS", "MAX_PER_CENTROID", "MAX_SIZE",
           "MIN_PER_CENTROID", "TRAIN_SEED", "check_declared_sizes", "check_sizes", "code_size",
           "default_nprobe", "faiss_module", "faiss_reason", "graph", "inverted_lists", "make",
           "no_lists", "sample", "set_ef_search", "set_nprobe", "structure", "training_rows"]

KINDS = ("flat", "hnsw")  # by name; any other kind is an index_factory string
# FAISS's k-means asks for at least 39 training vectors per centroid (fewer: a warning, and
# below one per centroid an error) and samples 256 per centroid from more
# (faiss.ClusteringParameters: min_points_per_centroid, max_points_per_centroid).
MIN_PER_CENTROID, MAX_PER_CENTROID = 39, 256
TRAIN_SEED = 0  # of the sample of the vectors a trained kind learns from
# FAISS takes these from an index_factory string and then crashes or hangs on them: a size of
# 0 (IVF0, PQ8x0, PCA0, NSG0, ...), an HNSW graph of one neighbour (a segfault), an NSG graph
# of under 8 (its build never ended on 300 vectors at 1 to 7)
_ZERO = re.compile(r"(?<![\d.])0+(?![\d.])")
_GRAPH = re.compile(r"(HNSW|NSG)(\d+)")
_GRAPH_MIN = {"HNSW": 2, "NSG": 8}
# and sizes FAISS allocates from without a bound, refused before any work: a graph's
# neighbours, any size (inverted lists, ...), bits a code (2^bits centroids; IMI's lists are
# 2^(parts x bits)), and a vector transform's output width (PCA, RR, ITQ, OPQ's _D), which
# cannot exceed the vectors' own
MAX_NEIGHBOURS, MAX_SIZE, MAX_BITS = 512, 1 << 20, 16
_SIZE = re.compile(r"(?<![\d.])\d+(?![\d.])")
_BITS = re.compile(r"(?:(IMI)(\d+))?x(\d+)")
_WIDTH = re.compile(r"(?:PCAW?R?|RR|ITQ|OPQ\d+_)(\d+)")


def faiss_module() -> Any:
    try:
        import faiss
    except ImportError:
        raise BertflowError("retrieval needs faiss: pip install 'bertflow[retrieval]'") from None
    return faiss


def make(kind: str, dim: int, dims: int, hnsw: dict[str, int] | None = None) -> Any:
    """An untrained, empty index of `dim`-d vectors: PCA to `dims` (when fewer), unit length,
    then `kind` by inner product; `hnsw` sets the graph of kind `hnsw` (`HNSW_DEFAULTS`'
    keys; those left out keep their default), which no other kind takes."""
    faiss = faiss_module()
    if not isinstance(kind, str) or not kind.strip():
        raise BertflowError(f"an index kind is flat, hnsw or a FAISS index_factory string; "
                            f"got {kind!r}")
    if hnsw and kind != "hnsw":
        raise BertflowError(f"HNSW's M, efConstruction and efSearch are set for kind hnsw; "
                            f"this index is {kind!r}")
    if kind == "flat":
        inner = faiss.IndexFlatIP(dims)
    elif kind == "hnsw":
        settings = {**HNSW_DEFAULTS, **(hnsw or {})}
        for name, value in settings.items():
            low, high = (2, MAX_NEIGHBOURS) if name == "M" else (1, MAX_SIZE)
            if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
                raise BertflowError(f"HNSW's {name} must be an integer from {low} to {high}, "
                                    f"got {value!r}")
        inner = faiss.IndexHNSWFlat(dims, settings["M"], faiss.METRIC_INNER_PRODUCT)
        inner.hnsw.efConstruction = settings["ef_construction"]
        inner.hnsw.efSearch = settings["ef_search"]
    else:
        check_sizes(kind, dims)
        try:
            inner = faiss.index_factory(dims, _unit_after_transforms(faiss, kind, dims),
                                        faiss.METRIC_INNER_PRODUCT)
        except RuntimeError as e:
            raise BertflowError(f"index kind {kind!r} is not flat, hnsw or a FAISS "
                                f"index_factory string for {dims}-d vectors by inner product "
                                f"({faiss_reason(e)})") from None
    index = faiss.IndexPreTransform(faiss.NormalizationTransform(dims, 2.0), inner)
    if dims < dim:
        index.prepend_transform(faiss.PCAMatrix(dim, dims))
    return index


def check_sizes(kind: str, dims: int | None = None) -> None:
    """Refuse the sizes of an index_factory string `kind` that FAISS would crash, hang or
    allocate without bound on (see `MAX_SIZE`); with `dims`, a transform's output wider than
    the `dims`-d vectors it is given."""
    small = [f"{g}{n}" for g, n in _GRAPH.findall(kind) if int(n) < _GRAPH_MIN[g]]
    if _ZERO.search(kind) or small:
        raise BertflowError(f"index kind {kind!r}: its sizes must be at least 1, an HNSW "
                            "graph's neighbours at least 2 and an NSG graph's at least 8")
    bits = max((int(n) * int(b) if imi else int(b) for imi, n, b in _BITS.findall(kind)),
               default=0)
    large = [f"{g}{n}" for g, n in _GRAPH.findall(kind) if int(n) > MAX_NEIGHBOURS]
    if large or bits > MAX_BITS or any(int(n) > MAX_SIZE for n in _SIZE.findall(kind)):
        raise BertflowError(f"index kind {kind!r}: its sizes must be at most {MAX_SIZE}, a "
                            f"graph's neighbours at most {MAX_NEIGHBOURS} and a code's bits "
                            f"at most {MAX_BITS}")
    wide = [n for n in _WIDTH.findall(kind) if dims is not None and int(n) > dims]
    if wide:
        raise BertflowError(f"index kind {kind!r}: a vector transform gives {wide[0]}-d "
                            f"vectors from {dims}-d ones; at most {dims}")


def check_declared_sizes(data: np.ndarray, where: str | os.PathLike) -> None:
    """Parse `data`, the bytes (uint8) of the FAISS file `where`, through FAISS's zero-copy
    reader, which views its vectors rather than copying them: a vector it declares past the
    file's end is refused there, where `faiss.read_index` would first allocate it (2^29 floats
    declared in a file of 7.8 KB took 2.4 GB before the read failed)."""
    faiss = faiss_module()
    if not data.size:
        return  # nothing to view; FAISS's own read says what is wrong
    try:
        faiss.read_index(faiss.ZeroCopyIOReader(faiss.swig_ptr(data), data.size))
    except RuntimeError as e:
        raise BertflowError(f"{where} is not a valid FAISS index ({faiss_reason(e)})") from None


def code_size(index: Any) -> int:
    """The bytes a vector takes in `index` (from `make`): its code, or that of the vectors an
    HNSW graph links; 0 for kinds that keep none this way."""
    faiss = faiss_module()
    inner = faiss.downcast_index(given := index)  # `given` owns it: keep it alive
    while isinstance(inner, faiss.IndexPreTransform | faiss.IndexHNSW):
        inner = faiss.downcast_index(
            inner.index if isinstance(inner, faiss.IndexPreTransform) else inner.storage)
    size = int(getattr(inner, "code_size", 0) or 0)
    del given
    return size


def _unit_after_transforms(faiss: Any, kind: str, dims: int) -> str:
    """`kind` with FAISS's ``L2norm`` after its own vector transforms (``PCA16``, ``PCAW16``,
    ``OPQ16_64``, ``ITQ``, ``RR64``, ...), which change lengths: without it the inner product
    of what they give is no cosine. Each transform is one part of the string, in order."""
    made = faiss.index_factory(dims, kind, faiss.METRIC_INNER_PRODUCT)  # owns what is read
    index = faiss.downcast_index(made)
    if not isinstance(index, faiss.IndexPreTransform):
        return kind
    count = index.chain.size()
    if isinstance(faiss.downcast_VectorTransform(index.chain.at(count - 1)),
                  faiss.NormalizationTransform):
        return kind
    parts = kind.split(",")
    return ",".join([*parts[:count], "L2norm", *parts[count:]])


def training_rows(index: Any, kind: str, count: int) -> int:
    """How many of `count` vectors `index` (from `make`) is trained on: all of them unless
    it clusters (IVF's lists, PQ's codebooks), then at most `MAX_PER_CENTROID` per centroid of
    its largest k-means; refused below `MIN_PER_CENTROID` per centroid."""
    k = _largest_kmeans(index)
    if not k:
        return count
    if count < MIN_PER_CENTROID * k:
        raise BertflowError(f"index kind {kind!r} trains a k-means of {k} centroids, which "
                            f"needs at least {MIN_PER_CENTROID * k} vectors "
                            f"({MIN_PER_CENTROID} a centroid); got {count}")
    return min(count, MAX_PER_CENTROID * k)


def sample(count: int, rows: int) -> np.ndarray | slice:
    """The rows (a seeded sample, in order) of `count` vectors that `rows` trains on."""
    if rows >= count:
        return slice(None)
    return np.sort(np.random.default_rng(TRAIN_SEED).choice(count, rows, replace=False))


def inverted_lists(index: Any) -> Any:
    """The IVF part of `index`, or None for kinds without inverted lists."""
    return faiss_module().try_extract_index_ivf(index)


def set_nprobe(index: Any, kind: str, nprobe: int) -> None:
    """Visit `nprobe` of the index's inverted lists per query."""
    ivf = inverted_lists(index)
    if ivf is None:
        raise no_lists(kind)
    if isinstance(nprobe, bool) or not isinstance(nprobe, int | np.integer) or \
            not 1 <= nprobe <= ivf.nlist:
        raise BertflowError(f"nprobe must be an integer from 1 to {ivf.nlist} (the index's "
                            f"lists), got {nprobe!r}")
    ivf.nprobe = int(nprobe)


def default_nprobe(index: Any) -> int | None:
    """The inverted lists a query of `index` visits unless told: the square root of their
    number, rounded up (FAISS's own 1 visits one list in 1,024 of IVF1024, and a query then
    finds fewer hits than asked for); None for kinds without lists."""
    ivf = inverted_lists(index)
    return None if ivf is None else math.isqrt(ivf.nlist - 1) + 1


def graph(index: Any) -> Any:
    """The HNSW graph that `index` searches (kind `hnsw`, or a string such as `HNSW32`), or
    None for kinds without one."""
    faiss = faiss_module()
    inner = faiss.downcast_index(index)
    while isinstance(inner, faiss.IndexPreTransform):
        inner = faiss.downcast_index(inner.index)
    return inner.hnsw if isinstance(inner, faiss.IndexHNSW) else None


def set_ef_search(index: Any, kind: str, ef: int) -> None:
    """Keep `ef` candidates while searching the index's HNSW graph (more: better recall,
    slower)."""
    found = graph(index)
    if found is None:
        raise BertflowError(f"efSearch applies to kinds with an HNSW graph (hnsw, HNSW...); "
                            f"this index is {kind!r}")
    if isinstance(ef, bool) or not isinstance(ef, int | np.integer) or ef < 1:
        raise BertflowError(f"efSearch must be an integer of at least 1, got {ef!r}")
    found.efSearch = int(ef)


def no_lists(kind: str) -> BertflowError:
    """The refusal of nprobe for an index of `kind`, which has no inverted lists."""
    return BertflowError(f"nprobe applies to kinds with inverted lists (IVF...); this index "
                         f"is {kind!r}")


def structure(index: Any) -> tuple:
    """What `index` is made of (classes, dimensions, metric, lists, code sizes), to compare a
    loaded index with the one its config describes; not its trained values."""
    faiss = faiss_module()
    index = faiss.downcast_index(given := index)  # `given` owns it: keep it alive
    name = "IndexFlat" if isinstance(index, faiss.IndexFlat) else type(index).__name__  # IP, L2
    parts: list[Any] = [name, index.d, index.metric_type, getattr(index, "code_size", None)]
    if isinstance(index, faiss.IndexPreTransform):
        for i in range(index.chain.size()):
            step = faiss.downcast_VectorTransform(index.chain.at(i))
            parts.append((type(step).__name__, step.d_in, step.d_out))
        parts.append(structure(index.index))
    if isinstance(index, faiss.IndexIVF):
        parts += [index.nlist, structure(index.quantizer)]
    if isinstance(index, faiss.IndexHNSW):
        parts.append(("M", index.hnsw.nb_neighbors(1)))
    del given
    return tuple(parts)


def _largest_kmeans(index: Any) -> int:
    """The centroids of the largest k-means that training `index` runs (0: none): the
    inverted lists, and the 2^bits codewords of each sub-quantizer of a PQ or OPQ."""
    faiss = faiss_module()
    found = [0]
    ivf = inverted_lists(index)
    if ivf is not None:
        found.append(ivf.nlist)
    inner = faiss.downcast_index(index)
    while isinstance(inner, faiss.IndexPreTransform):
        for i in range(inner.chain.size()):
            if isinstance(faiss.downcast_VectorTransform(inner.chain.at(i)), faiss.OPQMatrix):
                found.append(256)  # OPQ trains 8-bit PQ codebooks
        inner = faiss.downcast_index(inner.index)
    for part in (inner, ivf):
        pq = getattr(part, "pq", None)
        if pq is not None:
            found.append(pq.ksub)
    return max(found)


def faiss_reason(error: RuntimeError) -> str:
    """FAISS's message without the C++ function and file it comes from."""
    line = first_line(error)
    match = re.search(r"\.(?:cpp|h):\d+: (?:Error: )?(.*)", line)
    return match.group(1) if match else line
