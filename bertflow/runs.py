"""A head fit into a folder as `bertflow fit` runs it: from a corpus or an embeddings file,
resumable from a checkpoint file, logged to TensorBoard, scored on STS-B dev after each epoch.

`FitJob` says what to fit and where everything lives; `fit_head` runs it. The files a run
touches are checked before any work: the head folder, the checkpoint and the log folder
(none of them an input of the run or inside one, nor inside one another; the checkpoint never
someone else's file; the log folder gets a new subfolder per run, removed again when the run
fails and cannot be resumed).
"""

from __future__ import annotations

import itertools
import math
import shutil
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, NamedTuple

from . import distributed
from .cache import EmbeddingCache, training_embeddings
from .card import nll_text
from .constants import (
    DEFAULT_BATCH_SIZE,
    DEFAULT_ENCODER_NAME,
    DEFAULT_MAX_LENGTH,
    DEFAULT_POOLING,
)
from .corpus import Corpus
from .embeddings import EmbeddingFile
from .encoder import Encoder
from .errors import BertflowError, first_line
from .files import Checked, check_outputs
from .folders import HEAD_FOLDER
from .head import FlowHead
from .recipes import Recipe, resolve
from .train import Checkpoint, TrainState, log_hparams, open_checkpoint

__all__ = ["FitJob", "FittedHead", "fit_head"]

Say = Callable[[str], None]


@dataclass(frozen=True)
class FitJob:
    """What `bertflow fit` fits and where: the embeddings of `source` (a text file, encoded
    with `encoder`, `pooling` and `max_length` (default 128) on `device` in `dtype` through the
    embedding `cache`, or a `.npy` from `bertflow encode`, whose sidecar a `max_length` given
    must agree with), into the head folder `out`, by `method` (``flow``, or a closed-form
    baseline: ``whitening``, ``whitening-k`` keeping `k` components, ``abtt`` removing `d`
    directions). A flow is fit by `recipe`: a `Recipe`, or (a dict, by default empty) the
    changes to make to the recommended recipe of the embeddings' pooling (`Recipe.updated`),
    saving its state to `checkpoint` after each epoch (and continuing from it with `resume`),
    logging to a new subfolder of `logdir`, and scoring STS-B dev of the data folder `dev_sts`
    after each epoch."""

    source: Path
    out: Path
    method: str = "flow"
    k: int | None = None
    d: int | None = None
    recipe: Recipe | dict[str, Any] = field(default_factory=dict)
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


class FittedHead(NamedTuple):
    """What `fit_head` made: the head (saved in `FitJob.out`) and its TensorBoard folder."""

    head: FlowHead
    logs: Path | None


def fit_head(job: FitJob, *, say: Say | None = None,
             progress: bool | None = None) -> FittedHead | None:
    """Run `job`: fit the head and save it in `job.out`. `say` receives the lines a person
    follows the run by (each epoch's numbers, what a checkpoint is taken for); `progress`
    shows bars where they help (None), always (True) or never (False). Under torchrun every
    process calls it and only the first gets the result (the others None)."""
    say = say if distributed.is_main() else None
    job, check_width = _checked(job)
    if job.method != "flow":
        return _fit_linear(job, progress)
    dev = _read_dev(job.dev_sts) if job.dev_sts is not None else None
    saved = None
    if job.checkpoint is not None:
        saved = open_checkpoint(job.checkpoint, keep=not job.resume)
    x, origin = _embeddings(job, progress, check_width)
    if job.checkpoint is not None and isinstance(getattr(x, "path", None), Path):
        # the file actually read, known only now: a hard link to a cached file is outside the
        # cache folder checked above
        check_outputs({"--checkpoint": job.checkpoint}, {"the embeddings file": x.path})
    run = _run_record(job, origin)
    state = _state_to_resume(job, saved, run, say)
    measure = _dev_measure(job, dev, x, origin, progress) if dev is not None else None
    recorded = saved.logs if saved is not None and state is not None else None
    return _train(job, x, origin, run, state, recorded, measure, say, progress)


def _fit_linear(job: FitJob, progress: bool | None) -> FittedHead | None:
    x, origin = _embeddings(job, progress)
    if not distributed.is_main():
        return None
    head = FlowHead.fit_linear(x, job.method, k=job.k, d=job.d, encoder=origin["encoder"],
                               pooling=origin["pooling"], max_length=origin["max_length"],
                               corpus=origin["corpus"])
    head.save(job.out)
    return FittedHead(head, None)


def _checked(job: FitJob) -> tuple[FitJob, Callable[[int], None] | None]:
    """Refuse, before any work, what cannot be done: a head folder that may not be replaced,
    an output that overlaps an input or another output (`check_outputs`), a --max-length
    other than the embeddings file's, and a flow that cannot be built on the embeddings' width
    (here for a `.npy`; for a corpus, by the check returned, once the encoder is loaded). The
    job comes back with its recipe resolved."""
    HEAD_FOLDER.check_destination(job.out)
    check_outputs({"--checkpoint": job.checkpoint, "--logdir": job.logdir, "--out": job.out},
                  _fit_inputs(job), grows={"--logdir": ["--out"]})  # logs: a new subfolder
    if job.checkpoint is not None and job.checkpoint.is_symlink():
        raise BertflowError(f"--checkpoint {job.checkpoint} is a symbolic link; give the path "
                            "it points to")
    if job.source.suffix != ".npy":
        pooling, width = job.pooling or DEFAULT_POOLING, None
    else:
        with EmbeddingFile(job.source) as file:
            meta, width = file.meta, file.dim
        if meta is not None and job.max_length not in (None, meta["max_length"]):
            raise BertflowError(f"--max-length {job.max_length} differs from the "
                                f"{meta['max_length']} that {job.source} was encoded with")
        pooling = meta["pooling"] if meta is not None else job.pooling or DEFAULT_POOLING
    if job.method != "flow":
        return job, None
    job = replace(job, recipe=resolve(job.recipe, pooling))
    if width is None:
        return job, job.recipe.flow.check
    job.recipe.flow.check(width)
    return job, None


def _fit_inputs(job: FitJob) -> dict[str, Path | None]:
    """What a fit reads, by how a message names it."""
    encodes = job.source.suffix != ".npy" or job.dev_sts is not None
    return {"the input": job.source,
            "the embedding cache": EmbeddingCache(job.cache).root if encodes else None,
            "--encoder": Path(job.encoder) if job.encoder is not None else None,
            "--dev-sts": job.dev_sts}


def _embeddings(job: FitJob, progress: bool | None,
                check: Callable[[int], None] | None = None) -> tuple[Any, dict[str, Any]]:
    """The embeddings to fit; `check` sees their width before a corpus is encoded."""
    cache = EmbeddingCache(job.cache) if check is None else _CheckingCache(job.cache, check)
    return training_embeddings(job.source, encoder=job.encoder, pooling=job.pooling,
                               max_length=job.max_length or DEFAULT_MAX_LENGTH,
                               batch_size=job.batch_size, cache=cache, device=job.device,
                               dtype=job.dtype, progress=progress)


class _CheckingCache(EmbeddingCache):
    """The embedding cache, showing `check` the width of the embeddings asked for before it
    encodes anything."""

    def __init__(self, root: Path | None, check: Callable[[int], None]):
        super().__init__(root)
        self.check = check

    def files(self, corpus: Corpus, encoder: Encoder, pooling: str | Sequence[str],
              *args: Any, **kwargs: Any) -> dict[str, EmbeddingFile]:
        for name in [pooling] if isinstance(pooling, str) else pooling:
            self.check(encoder.width(name))
        return super().files(corpus, encoder, pooling, *args, **kwargs)


def _run_record(job: FitJob, origin: dict[str, Any]) -> dict[str, Any]:
    """The settings and data a checkpoint of this job belongs to."""
    return {
        "flow": job.recipe.flow.to_dict(),
        "train": job.recipe.train.to_dict(),
        "standardize": job.recipe.before == "standardize",
        **({"whiten": True} if job.recipe.before == "whiten" else {}),
        "encoder": origin["encoder"].fingerprint if origin["encoder"] else None,
        "pooling": origin["pooling"],
        "max_length": origin["max_length"],
        "data": origin["data"],
    }


def _state_to_resume(job: FitJob, saved: Checkpoint | None, run: dict[str, Any],
                     say: Say | None) -> TrainState | None:
    """The state the job continues from: the checkpoint's, when resuming a run of these
    settings and data (or of fewer epochs, extended); a checkpoint of another run is
    refused."""
    if saved is not None:
        saved.check(job.checkpoint, run, extended=job.resume, keep=not job.resume)
    state = saved.state if saved is not None and job.resume else None
    if say is not None and state is not None and saved.run != run:
        train = job.recipe.train
        stopped = bool(train.patience) and state.bad_epochs >= train.patience
        say(f"extending the run in {job.checkpoint} from {saved.run['train']['epochs']} to "
            f"{train.epochs} epochs: from step {state.step + 1} on, the learning rate follows "
            f"the cosine over {train.epochs} epochs" + (
                f" (but it stopped early, after {train.patience} epochs without a better "
                "held-out NLL: it ends there)" if stopped else ""))
    if say is not None and state is None and (saved is not None or job.resume):
        say(f"{job.checkpoint} holds an earlier state of this run: starting afresh "
            "(--resume continues it)" if saved is not None else
            f"no checkpoint at {job.checkpoint} yet: starting afresh")
    return state


def _train(job: FitJob, x: Any, origin: dict[str, Any], run: dict[str, Any],
           state: TrainState | None, recorded: str | None, measure: Any, say: Say | None,
           progress: bool | None) -> FittedHead | None:
    """Fit, with the checkpoint written after each epoch and the logs in their folder; save
    the head. A failed run leaves `--logdir` as it was unless a checkpoint can resume it."""
    main = distributed.is_main()
    checkpoint = None  # checked again here: it may have changed while the data was encoded
    if job.checkpoint is not None and main:
        checkpoint = Checked(job.checkpoint, lambda p: _check_checkpoint(p, job, run))
    logs = None
    if job.logdir is not None and main:
        logs = _RunLogs(job.logdir, job.recipe.train.seed, recorded)
    epoch_end = _EpochEnd(job, run, logs.folder.name if logs else recorded, state, say, main,
                          checkpoint)
    done = False  # the head fitted and saved
    try:
        writer = logs.open(state) if logs is not None else None
        head = _fit_flow(job, x, origin, state, writer, epoch_end, measure, progress)
        if main:
            head.save(job.out)
        done = True
        if writer is not None:
            hparams = {**run, "encoder": origin["encoder"].name if origin["encoder"] else None,
                       "data": origin["corpus"].get("file"),
                       "corpus_size": head.training_info["corpus"]["size"]}
            log_hparams(writer, hparams, head.history, epoch_end.step)
    finally:
        if logs is not None:
            resumable = state is not None and logs.folder.name == recorded
            logs.close(keep=done or epoch_end.written or resumable)
    return FittedHead(head, logs.folder if logs else None) if main else None


def _fit_flow(job: FitJob, x: Any, origin: dict[str, Any], state: TrainState | None,
              writer: Any, epoch_end: _EpochEnd, measure: Any,
              progress: bool | None) -> FlowHead:
    try:
        return FlowHead.fit(
            x,
            encoder=origin["encoder"],
            pooling=origin["pooling"],
            max_length=origin["max_length"],
            **job.recipe.fit_options(),
            corpus=origin["corpus"],
            writer=writer,
            state=state,
            on_epoch_end=epoch_end,
            measure=measure,
            progress=progress is not False,
        )
    except (RuntimeError, KeyError, TypeError, ValueError) as e:
        if state is None or isinstance(e, BertflowError):
            raise
        raise BertflowError(f"{job.checkpoint} does not fit this run ({first_line(e)})") \
            from None


class _EpochEnd:
    """After each epoch (first process only): say its numbers and save the checkpoint
    (`checkpoint`: checked again, where it has changed since, before each save)."""

    def __init__(self, job: FitJob, run: dict[str, Any], logs: str | None,
                 state: TrainState | None, say: Say | None, main: bool,
                 checkpoint: Checked | None):
        self.job, self.run, self.logs, self.say, self.main = job, run, logs, say, main
        self.step = state.step if state is not None else 0  # the last step done
        self.written = False  # whether a checkpoint of this run names its log folder
        self.checkpoint = checkpoint

    def __call__(self, state: TrainState) -> None:
        if not self.main:
            return
        self.step = state.step
        if self.say is not None:
            e = state.history.epochs[-1]
            dev = f", dev Spearman {e['dev_spearman']:.2f}" if "dev_spearman" in e else ""
            self.say(f"epoch {int(e['epoch'])}/{self.job.recipe.train.epochs}: train "
                     f"{e['train_nll']:.3f} val {nll_text(e)}, val cosine "
                     f"{e['val_cosine']:.3f}{dev}")
        if self.checkpoint is not None:
            state.save(self.checkpoint.path, self.run, logs=self.logs, recheck=self.checkpoint)
            self.written = True


def _check_checkpoint(path: Path, job: FitJob, run: dict[str, Any]) -> None:
    """Keep the file at `path` unless it is a checkpoint of `run` (or, resuming, of that run
    with fewer epochs)."""
    saved = open_checkpoint(path, keep=True)
    if saved is not None:
        saved.check(path, run, extended=job.resume, keep=True)


class _RunLogs:
    """A run's TensorBoard folder inside `logdir`: the one named by the checkpoint a run
    resumes (`recorded`), else a new TIME-seedN; and the folders made for it, innermost first
    (the run's folder, then any missing parents, `logdir` included)."""

    def __init__(self, logdir: Path, seed: int, recorded: str | None):
        self.made = [p for p in (logdir, *logdir.parents) if not p.exists()]
        self.writer: Any = None
        if recorded and recorded == Path(recorded).name and recorded not in (".", ".."):
            self.folder = logdir / recorded
            if not self.folder.exists():
                self.made.insert(0, self.folder)
            self.folder.mkdir(parents=True, exist_ok=True)
            return
        logdir.mkdir(parents=True, exist_ok=True)
        stamp = time.strftime("%Y%m%d-%H%M%S")
        for n in itertools.count(1):
            self.folder = logdir / f"{stamp}-seed{seed}{f'-{n}' if n > 1 else ''}"
            try:
                self.folder.mkdir()
            except FileExistsError:
                continue
            self.made.insert(0, self.folder)
            return

    def open(self, state: TrainState | None) -> Any:
        """The run's `SummaryWriter`; a resumed run hides what the interrupted one logged
        after its checkpoint."""
        from torch.utils.tensorboard import SummaryWriter

        _after_newest_events(self.folder)
        self.writer = SummaryWriter(str(self.folder),
                                    purge_step=state.step + 1 if state is not None else None)
        return self.writer

    def close(self, keep: bool) -> None:
        """Close the writer; unless `keep`, remove the run's folder with its logs if this run
        made it, then the parents made for it while they are empty. Nothing else is
        touched."""
        if self.writer is not None:
            self.writer.close()
        if keep:
            return
        for path in self.made:
            if path == self.folder:
                shutil.rmtree(path, ignore_errors=True)
                continue
            try:
                path.rmdir()
            except OSError:
                return


def _after_newest_events(folder: Path) -> None:
    """Wait, where needed, until the clock has passed the second of the newest event file in
    `folder`. TensorBoard reads a folder's event files in the order of their names, which start
    with the second they were made in and end with the process's writer count: a file made in
    the same second as the one it continues could be read first (count 10 sorts before 9), and
    the continued curves would be cut back to the earlier file's steps."""
    seconds = [int(part) for p in folder.glob("events.out.tfevents.*")
               if (part := p.name.split(".")[3]).isdigit()]
    if seconds:
        time.sleep(max(0.0, max(seconds) + 1 - time.time()))


def _read_dev(data: Path) -> Any:
    """The STS-B dev pairs of `--dev-sts DATA` (DATA/STSBenchmark, or DATA itself)."""
    from .sts import read_stsb

    for folder in (data / "STSBenchmark", data):
        if (folder / "sts-dev.csv").is_file():
            return read_stsb(folder, "dev")
    raise BertflowError(f"--dev-sts {data} holds no STSBenchmark/sts-dev.csv (STS-B in "
                        "SentEval's layout)")


def _dev_measure(job: FitJob, dev: Any, x: Any, origin: dict[str, Any],
                 progress: bool | None) -> Callable[[Any], dict[str, float]]:
    """What `--dev-sts` measures after each epoch: the Spearman × 100 of the STS-B dev pairs'
    cosines in the latent space of the model being fit (NaN where undefined), the sentences
    embedded with the training embeddings' encoder, precision, pooling and max length, through
    the embedding cache."""
    import numpy as np
    import torch

    from .encoder import load_encoder
    from .sts import pair_spearman

    made_by = origin["encoder"]
    if made_by is None:
        raise BertflowError(f"--dev-sts needs the encoder that made {job.source}, which has no "
                            "sidecar naming one; pass --encoder with it")
    if job.encoder is None and made_by.name != DEFAULT_ENCODER_NAME:
        raise BertflowError(f"--dev-sts needs the encoder that made {job.source} "
                            f"({made_by.name}); pass --encoder with its folder")
    precision = (getattr(x, "meta", None) or {}).get("precision") or job.dtype
    encoder = origin.get("loaded") or load_encoder(job.encoder, job.device, precision)
    if encoder.id.fingerprint != made_by.fingerprint:
        raise BertflowError(f"--dev-sts: {job.source} was made by encoder {made_by}, not by "
                            f"{encoder.id}")
    sentences = dev.sentences()
    vectors = np.array(EmbeddingCache(job.cache).encode(
        sentences, encoder, origin["pooling"], origin["max_length"], job.batch_size,
        progress=progress), dtype=np.float32)

    def measure(model: torch.nn.Module) -> dict[str, float]:
        z = model(torch.from_numpy(vectors))[0].double().cpu().numpy()
        value = pair_spearman(dev, sentences, z)
        return {"dev_spearman": math.nan if value is None else value}

    return measure
