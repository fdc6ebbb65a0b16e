"""`bertflow fit` as a library call: resumable, logged to TensorBoard, scored on STS-B dev."""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
import torch

from ..config import nll_text
from ..constants import (
    DEFAULT_BATCH_SIZE,
    DEFAULT_ENCODER_NAME,
    DEFAULT_MAX_LENGTH,
    DEFAULT_POOLING,
)
from ..embeddings.cache import EmbeddingCache
from ..embeddings.file import EmbeddingFile, open_embeddings
from ..encoders.batches import check_max_length
from ..encoders.loading import load_encoder
from ..errors import BertflowError
from ..heads.head import Head
from ..runtime import distributed
from ..storage.artifacts import HEAD_FOLDER
from ..storage.corpus import Corpus, titled
from ..storage.files import check_outputs
from .checkpoint import CheckpointFile
from .choice import Choice, candidates, choose_head, feedback_candidates, fit_candidate, query_log
from .proxy import Proxy, build_proxy
from .recipes import choose, close_call, corpus_note, rule_note
from .spec import MethodSpec
from .tensorboard import RunLogs
from .trainer import TrainState, fit_head

__all__ = ["FitJob", "FittedHead", "run_fit"]

Say = Callable[[str], None]


@dataclass(frozen=True)
class FitJob:
    """The arguments of `bertflow fit` (`source`: a text file or an encoded `.npy`): what it fits
    (`method`) and from what."""

    def __post_init__(self) -> None:
        if not isinstance(self.method, str | MethodSpec):
            raise BertflowError(f"a fit job's method is a MethodSpec or a method's name, not "
                                f"{self.method!r}")
        object.__setattr__(self, "method", MethodSpec.of(self.method))

    source: Path
    out: Path
    method: MethodSpec = field(default_factory=MethodSpec)
    encoder: str | None = None
    pooling: str | None = None
    max_length: int | None = None
    batch_size: int = DEFAULT_BATCH_SIZE
    device: str = "auto"
    dtype: str = "float32"
    cache: Path | None = None
    checkpoint: Path | None = None
    resume: bool = False
    logdir: Path | None = None
    dev_sts: Path | None = None
    choose_for: str | None = None  # a proxy's kind: choose the head on it (`_choose`)
    queries: Path | None = None  # a query log that joins the corpus in each candidate's fit
    dims: int | None = None  # the candidates' components, where fewer than the embeddings'


class FittedHead(NamedTuple):
    """The head saved in `FitJob.out`, its TensorBoard folder, and the choice it won (every
    candidate fit, `bertflow.training.choice.Choice`) where the job chose it."""

    head: Head
    logs: Path | None
    choice: Choice | None = None


def run_fit(job: FitJob, *, say: Say | None = None,
            progress: bool | None = None) -> FittedHead | None:
    """Fit the head of `job` and save it in `job.out`; `say` gets each epoch's line and the
    notes (the recipe the rule chose, and the text it was chosen on where that is not one file,
    as `bertflow eval` says it). Under torchrun every process calls it, and only the first gets
    the result."""
    say = say if distributed.is_main() else None
    HEAD_FOLDER.check_destination(job.out)
    encodes = job.source.suffix != ".npy" or job.dev_sts is not None
    check_outputs({"--checkpoint": job.checkpoint, "--logdir": job.logdir, "--out": job.out},
                  {"the input": job.source,
                   "the embedding cache": EmbeddingCache(job.cache).root if encodes else None,
                   "--encoder": Path(job.encoder) if job.encoder is not None else None,
                   "--dev-sts": job.dev_sts},
                  grows={"--logdir": ["--out"]})  # logs: a new subfolder
    flow = job.method.name == "flow"
    checkpoint = CheckpointFile(job.checkpoint, job.resume) if job.checkpoint and flow else None
    dev = _read_dev(job.dev_sts) if job.dev_sts is not None else None
    proxy, log = _proxy(job)  # before anything is encoded
    x, origin = _source(job, progress)
    job = _settle(job, origin["pooling"], x, say)
    if proxy is not None:
        choice = _choose(job, proxy, log, x, origin, say, progress)
        return FittedHead(choice.head, None, choice)
    if not flow:
        if not distributed.is_main():
            return None
        head = fit_candidate(job.method, x, **_recorded(origin))
        head.save(job.out)
        return FittedHead(head, None)
    fitted = _train(job, x, origin, checkpoint, dev, say, progress)
    note = corpus_note(origin["pooling"], [job.source], job.method.recipe.corpus, options=False)
    if say is not None and note is not None:  # once the head is written, as eval's notes
        say(note)
    return fitted


def _source(job: FitJob, progress: bool | None) -> tuple[Any, dict[str, Any]]:
    """The embeddings and their origin (`open_embeddings`'s, and the `Encoder` as ``loaded``); a
    flow too wide for them, or a --max-length other than a `.npy`'s, is refused before anything
    is encoded (a text file's through the cache)."""
    flow, max_length = job.method.name == "flow", job.max_length or DEFAULT_MAX_LENGTH
    if job.source.suffix != ".npy":
        if job.max_length is not None:
            check_max_length(max_length)  # and against the encoder when one encodes the text
        corpus = Corpus.from_file(job.source)
        loaded = load_encoder(job.encoder, job.device, job.dtype)
        pooling, max_length = loaded.defaults(job.pooling, job.max_length)
        if job.dims is not None:
            candidates(loaded.width(pooling), job.dims)  # refused before anything is encoded
        if flow:
            choose(job.method.recipe, pooling)[0].flow.check(loaded.width(pooling))
        x = EmbeddingCache(job.cache).files(corpus, loaded, pooling, max_length, job.batch_size,
                                            progress=progress)[pooling]
        return x, {"encoder": loaded.id, "pooling": pooling, "max_length": max_length,
                   "data": corpus.sha256, "loaded": loaded,
                   "corpus": {"sha256": corpus.sha256, "file": job.source.name}}
    with EmbeddingFile(job.source) as file:
        meta, width = file.meta or {}, file.dim
    if job.max_length not in (None, meta.get("max_length", job.max_length)):
        raise BertflowError(f"--max-length {job.max_length} differs from the "
                            f"{meta['max_length']} that {job.source} was encoded with")
    pooling = meta.get("pooling") or job.pooling or DEFAULT_POOLING
    if flow:
        choose(job.method.recipe, pooling)[0].flow.check(width)
    loaded = None  # --encoder, where given: on the device and in the precision --dev-sts needs
    if job.encoder is not None:
        loaded = load_encoder(job.encoder, *(
            (job.device, meta.get("precision") or job.dtype) if job.dev_sts else ("cpu",)))
    x, origin = open_embeddings(job.source, pooling=job.pooling, encoder=loaded,
                                max_length=max_length)
    return x, {**origin, "loaded": loaded}


def _recorded(origin: dict[str, Any]) -> dict[str, Any]:
    """What a head records of where its embeddings come from (`fit_head`'s keywords)."""
    return {key: origin[key] for key in ("encoder", "pooling", "max_length", "corpus")}


def _settle(job: FitJob, pooling: str, x: Any, say: Say | None) -> FitJob:
    """The job with a flow's recipe resolved for embeddings `x` (`bertflow.training.recipes`' rule,
    said, and warned of where it was a close call) and checked against their width."""
    if job.method.name != "flow":
        return job
    recipe, cosine = choose(job.method.recipe, pooling, x, stacklevel=3)
    if say is not None and cosine is not None and not close_call(cosine):
        say(f"note: {rule_note(pooling, cosine)}")
    recipe.flow.check(x.dim)
    return replace(job, method=replace(job.method, recipe=recipe))


def _train(job: FitJob, x: Any, origin: dict[str, Any], checkpoint: CheckpointFile | None,
           dev: Any, say: Say | None, progress: bool | None) -> FittedHead | None:
    """Fit the flow, checkpointing and logging each epoch, and save the head. A failed run leaves
    `--logdir` as it was unless a checkpoint can resume it."""
    recipe = job.method.recipe
    run = {"flow": recipe.flow.to_dict(), "train": recipe.train.to_dict(),
           "before": recipe.before, "pooling": origin["pooling"],
           "encoder": origin["encoder"].fingerprint if origin["encoder"] else None,
           "max_length": origin["max_length"], "data": origin["data"]}  # what a checkpoint is of
    state = checkpoint.state_for(run, say) if checkpoint is not None else None
    measure = _dev_measure(job, dev, x, origin, progress) if dev is not None else None
    main = distributed.is_main()
    recorded = checkpoint.saved.logs if state is not None else None
    logs = RunLogs(job.logdir, recipe.train.seed, recorded) \
        if job.logdir is not None and main else None
    last = state  # the last epoch's state: the resumed one, then each epoch's as it ends

    def epoch_end(done: TrainState) -> None:
        nonlocal last
        if say is not None:
            e = done.history.epochs[-1]
            dev = f", dev Spearman {e['dev_spearman']:.2f}" if "dev_spearman" in e else ""
            say(f"epoch {int(e['epoch'])}/{recipe.train.epochs}: train "
                f"{e['train_nll']:.3f} val {nll_text(e)}, val cosine {e['val_cosine']:.3f}{dev}")
        if checkpoint is not None and main:
            checkpoint.save(done, logs.folder.name if logs else recorded)
        last = done

    fitted = False
    try:
        hook = logs.open(state) if logs is not None else None
        head = fit_head(x, **_recorded(origin), **recipe.fit_options(), hook=hook, state=state,
                        on_epoch_end=epoch_end, measure=measure, progress=progress is not False)
        if main:
            head.save(job.out)
        fitted = True
        if hook is not None:
            hparams = {**run, "encoder": origin["encoder"].name if origin["encoder"] else None,
                       "data": origin["corpus"].get("file"),
                       "corpus_size": head.training_info["corpus"]["size"]}
            hook.hparams(hparams, head.history, last.step if last else 0)
    finally:
        if logs is not None:  # a checkpoint saved or resumed names the folder: kept
            saved = checkpoint is not None and last is not state
            logs.close(keep=fitted or saved or logs.resumed)
    return FittedHead(head, logs.folder if logs else None) if main else None


def _proxy(job: FitJob) -> tuple[Proxy | None, Corpus | None]:
    """The proxy of `job.choose_for` built from its corpus (`bertflow.training.proxy`), or
    None, and its query log, read and checked; what cannot apply to a choice is refused
    first."""
    if job.choose_for is None:
        if (job.queries, job.dims) != (None, None):
            raise BertflowError("a query log and dims apply to a head chosen on a proxy")
        return None, None
    if job.source.suffix == ".npy":
        raise BertflowError(f"--for {job.choose_for} builds its proxy from the corpus's text: "
                            f"give the corpus, not the embeddings {job.source}")
    if job.method.name != "flow" or (job.checkpoint, job.logdir, job.dev_sts) != (None,) * 3:
        raise BertflowError("a head chosen on a proxy takes no method, checkpoint, log folder "
                            "or dev set")
    if distributed.world_size() > 1:
        raise BertflowError(f"--for {job.choose_for} runs in one process, not under torchrun")
    if job.queries is not None and job.choose_for != "retrieval":
        raise BertflowError("a query log applies to --for retrieval")
    log = Corpus.from_file(job.queries) if job.queries is not None else None
    return build_proxy(job.choose_for, titled(job.source), name=str(job.source)), log


def _choose(job: FitJob, proxy: Proxy, log_corpus: Corpus | None, x: Any,
            origin: dict[str, Any], say: Say | None, progress: bool | None) -> Choice:
    """The head chosen on `proxy` (`bertflow.training.choice`), each candidate fit on the
    corpus and the query log, saved with the evidence in its config."""
    loaded, pooling, max_length = origin["loaded"], origin["pooling"], origin["max_length"]
    cache = EmbeddingCache(job.cache)

    def embed(texts: list[str] | Corpus) -> np.ndarray:
        corpus = texts if isinstance(texts, Corpus) else Corpus.from_sentences(texts, "a proxy")
        return cache.files(corpus, loaded, pooling, max_length, job.batch_size,
                           progress=progress)[pooling].load()

    data, log = x, None
    if log_corpus is not None:
        data = np.concatenate([np.asarray(x.load()), embed(log_corpus)])
        log = query_log(job.queries, log_corpus)
    given = _recorded(origin)

    def fit(spec: MethodSpec, before: Head | None = None) -> Head:  # `before`: a map to follow
        head = fit_candidate(spec, data, job.method.recipe, before and before.linear, **given)
        head.training_info["query_log"] = log  # never scored on its queries
        return head

    specs = candidates(loaded.width(pooling), job.dims)
    after = functools.partial(fit, MethodSpec("flow")) if job.dims is None else None
    feedback = feedback_candidates() if job.choose_for == "retrieval" else []
    choice = choose_head(specs, fit, proxy, embed, say=say, after=after, feedback=feedback)
    choice.head.training_info["choice"] = choice.evidence()
    choice.head.save(job.out)
    return choice


def _read_dev(data: Path) -> Any:
    """The STS-B dev pairs of `--dev-sts DATA` (DATA/STSBenchmark, or DATA itself)."""
    from ..data.sts import read_stsb

    for folder in (data / "STSBenchmark", data):
        if (folder / "sts-dev.csv").is_file():
            return read_stsb(folder, "dev")
    raise BertflowError(f"--dev-sts {data} holds no STSBenchmark/sts-dev.csv (STS-B in "
                        "SentEval's layout)")


def _dev_measure(job: FitJob, dev: Any, x: Any, origin: dict[str, Any],
                 progress: bool | None) -> Callable[[Any], dict[str, float]]:
    """The Spearman × 100 of STS-B dev's latent cosines (NaN where undefined)."""
    from ..data.sts import pair_spearman

    made_by = origin["encoder"]
    if made_by is None or (job.encoder is None and made_by.name != DEFAULT_ENCODER_NAME):
        raise BertflowError(f"--dev-sts needs the encoder that made {job.source}" + (
            ", which has no sidecar naming one; pass --encoder with it" if made_by is None
            else f" ({made_by.name}); pass --encoder with its folder"))
    precision = (getattr(x, "meta", None) or {}).get("precision") or job.dtype
    encoder = origin.get("loaded") or load_encoder(None, job.device, precision)
    if encoder.id.fingerprint != made_by.fingerprint:
        raise BertflowError(f"--dev-sts: {job.source} was made by encoder {made_by}, not by "
                            f"{encoder.id}")
    sentences = dev.sentences()
    vectors = torch.from_numpy(np.array(EmbeddingCache(job.cache).encode(
        sentences, encoder, origin["pooling"], origin["max_length"], job.batch_size,
        progress=progress), dtype=np.float32))

    def measure(model: torch.nn.Module) -> dict[str, float]:
        value = pair_spearman(dev, sentences, model(vectors)[0].double().cpu().numpy())
        return {"dev_spearman": math.nan if value is None else value}

    return measure
