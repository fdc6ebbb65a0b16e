"""What a fit logs to TensorBoard, read back from the event files: per-step and per-epoch
curves, the isotropy of held-out latents, STS-B dev Spearman, hparams, and resumed runs."""

import math
import shutil
import time

import numpy as np
import pytest
import torch
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from tensorboard.plugins.hparams import plugin_data_pb2
from torch.utils.tensorboard import SummaryWriter

from bertflow import FlowConfig, FlowHead, TrainConfig, fit_head
from bertflow.cli.main import main
from bertflow.data.sts import pair_spearman, read_stsb
from bertflow.training.tensorboard import TensorBoard

from ..conftest import SENTENCES, WORDS

PER_STEP = {"train/nll", "train/bits_per_dim", "train/log_det", "train/lr", "train/grad_norm"}
PER_EPOCH = {"train/epoch", "train/epoch_nll", "train/rows_per_second", "val/nll",
             "val/bits_per_dim", "val/log_det", "cosine/latent", "effective_rank/latent",
             "partition_isotropy/latent"}
AT_START = {"cosine/input", "effective_rank/input", "partition_isotropy/input"}
FIT = ["--levels", "1", "--depth", "2", "--patience", "0", "--batch-size", "32", "--lr", "1e-3"]


def run(capsys, *args):
    code = main([str(a) for a in args])
    out, err = capsys.readouterr()
    return code, out, err


def events(folder):
    accumulator = EventAccumulator(str(folder), size_guidance={"scalars": 0, "histograms": 0})
    accumulator.Reload()
    return accumulator


def steps(accumulator, tag):
    return [e.step for e in accumulator.Scalars(tag)]


def cosine_lr(lr, step, total):
    return lr * 0.5 * (1 + math.cos(math.pi * (step - 1) / total))


def write_stsb_dev(data):
    """STS-B in SentEval's layout, with dev pairs of words the tiny encoder knows."""
    folder = data / "STSBenchmark"
    folder.mkdir(parents=True)
    rng = np.random.default_rng(1)
    lines = []
    for i in range(16):
        a = SENTENCES[i % len(SENTENCES)]
        b = " ".join(rng.choice(WORDS, size=rng.integers(2, 7)))
        lines.append(f"main-captions\tMSRvid\t2012test\t{i:04d}\t{(i * 0.31) % 5:.2f}\t{a}\t{b}")
    for split in ("train", "dev", "test"):
        (folder / f"sts-{split}.csv").write_text("\n".join(lines) + "\n")
    return data


def test_fit_logs_each_step_and_each_epoch_once(tmp_path):
    x = np.random.default_rng(0).normal(size=(200, 8)).astype(np.float32) @ np.diag(
        np.arange(1, 9, dtype=np.float32))
    config = TrainConfig(epochs=3, batch_size=30, patience=0, max_grad_norm=5.0)
    calls = []

    def measure(model):
        calls.append(model.training)
        return {"dev_score": float(len(calls))}

    with SummaryWriter(str(tmp_path)) as writer:
        head = fit_head(x, flow=FlowConfig(levels=1, depth=2), train=config,
                            hook=TensorBoard(writer), measure=measure)
    acc = events(tmp_path)
    per_epoch = math.ceil(180 / 30)  # 20 of the 200 rows are held out
    total = 3 * per_epoch
    assert PER_STEP | PER_EPOCH | AT_START | {"dev/score"} <= set(acc.Tags()["scalars"])
    for tag in PER_STEP:
        assert steps(acc, tag) == list(range(1, total + 1)), tag
    for tag in PER_EPOCH | {"dev/score"}:
        assert steps(acc, tag) == [per_epoch, 2 * per_epoch, total], tag
    for tag in AT_START:
        assert steps(acc, tag) == [0], tag
    assert [e.value for e in acc.Scalars("train/epoch")] == [1, 2, 3]
    assert [e.value for e in acc.Scalars("dev/score")] == [1, 2, 3]
    assert [e.value for e in acc.Scalars("train/epoch_nll")] == pytest.approx(
        [r["train_nll"] for r in head.history.epochs])
    assert [e.value for e in acc.Scalars("val/nll")] == pytest.approx(
        [r["val_nll"] for r in head.history.epochs])
    assert [e.value for e in acc.Scalars("train/lr")] == pytest.approx(
        [cosine_lr(config.lr, s, total) for s in range(1, total + 1)])
    assert all(e.value > 0 for e in acc.Scalars("train/grad_norm"))
    assert all(e.value > 0 for e in acc.Scalars("train/rows_per_second"))
    assert 1 <= acc.Scalars("effective_rank/latent")[-1].value <= 8
    assert 0 < acc.Scalars("partition_isotropy/latent")[-1].value <= 1
    assert len(acc.Histograms("latent/z")) == 3
    assert calls == [False] * 3  # measured in eval mode, once per epoch
    assert [r["dev_score"] for r in head.history.epochs] == [1, 2, 3]


def test_hparams_land_in_the_run_folder_itself(tmp_path):
    x = np.random.default_rng(0).normal(size=(80, 4)).astype(np.float32)
    with SummaryWriter(str(tmp_path)) as writer:
        hook = TensorBoard(writer)
        head = fit_head(x, flow=FlowConfig(levels=1, depth=2), train=TrainConfig(epochs=2),
                            hook=hook, measure=lambda model: {"dev_spearman": 42.0})
        hook.hparams({"flow": {"levels": 1}, "pooling": "cls", "max_grad_norm": None,
                      "shape": (80, 4)}, head.history, step=6)
    assert [p for p in tmp_path.iterdir() if p.is_dir()] == []
    acc = events(tmp_path)
    hparams = plugin_data_pb2.HParamsPluginData.FromString(
        acc.PluginTagToContent("hparams")["_hparams_/session_start_info"]
    ).session_start_info.hparams
    assert set(hparams) == {"flow/levels", "pooling", "shape"}
    assert hparams["pooling"].string_value == "cls" and hparams["shape"].string_value == "(80, 4)"
    assert hparams["flow/levels"].number_value == 1
    assert acc.Scalars("hparams/best_val_nll")[0].value == pytest.approx(
        head.history.best_val_nll)
    assert acc.Scalars("hparams/dev_spearman")[0].value == 42.0
    assert steps(acc, "hparams/last_dev_spearman") == [6]


def test_fit_with_dev_sts_prints_and_logs_spearman_and_hparams(
    tmp_path, capsys, corpus_file, tiny_encoder_dir
):
    data = write_stsb_dev(tmp_path / "data")
    logdir, head = tmp_path / "runs", tmp_path / "head"
    code, out, err = run(capsys, "fit", corpus_file, "--out", head, "--encoder",
                         tiny_encoder_dir, "--pooling", "cls", "--cache", tmp_path / "cache",
                         "--logdir", logdir, "--dev-sts", data, "--epochs", "2", *FIT)
    assert code == 0, err
    epoch_lines = [line for line in err.splitlines() if line.startswith(("epoch 1/", "epoch 2/"))]
    assert len(epoch_lines) == 2 and all("dev Spearman " in line for line in epoch_lines)
    [folder] = logdir.iterdir()
    assert [p for p in folder.iterdir() if p.is_dir()] == []  # hparams too in the run's folder
    acc = events(folder)
    per_epoch = math.ceil(108 / 32)  # 12 of the 120 lines are held out
    assert steps(acc, "dev/spearman") == [per_epoch, 2 * per_epoch]
    assert PER_STEP | PER_EPOCH | AT_START <= set(acc.Tags()["scalars"])
    for tag in PER_STEP:
        assert steps(acc, tag) == list(range(1, 2 * per_epoch + 1)), tag

    content = acc.PluginTagToContent("hparams")["_hparams_/session_start_info"]
    hparams = plugin_data_pb2.HParamsPluginData.FromString(content).session_start_info.hparams
    assert {"flow/levels", "flow/depth", "train/epochs", "train/lr", "train/seed", "pooling",
            "encoder", "max_length", "before", "corpus_size", "data"} <= set(hparams)
    assert hparams["pooling"].string_value == "cls"
    assert hparams["encoder"].string_value == tiny_encoder_dir.name
    assert hparams["corpus_size"].number_value == 120
    assert hparams["train/epochs"].number_value == 2

    # the logged dev Spearman of the best epoch is the saved head's
    loaded = FlowHead.load(head)
    dev = read_stsb(data / "STSBenchmark", "dev")
    sentences = dev.sentences()
    from bertflow import load_encoder

    x = load_encoder(tiny_encoder_dir).encode(sentences, "cls", 128)
    expected = pair_spearman(dev, sentences, loaded.transform(x))
    logged = acc.Scalars("hparams/dev_spearman")[0].value
    assert logged == pytest.approx(expected, abs=1e-4)
    best = loaded.training_info["best_epoch"]
    assert acc.Scalars("dev/spearman")[best - 1].value == pytest.approx(expected, abs=1e-4)
    assert acc.Scalars("hparams/best_val_nll")[0].value == pytest.approx(
        loaded.training_info["val_nll"])


def test_dev_sts_is_refused_without_a_known_encoder_or_a_dev_set(
    tmp_path, capsys, tiny_encoder_dir, monkeypatch
):
    npy = tmp_path / "x.npy"
    np.save(npy, np.random.default_rng(0).normal(size=(40, 16)).astype(np.float32))
    data = write_stsb_dev(tmp_path / "data")
    (tmp_path / "empty").mkdir()
    for args, message in [
        (["--dev-sts", data], "--dev-sts needs the encoder that made"),
        (["--dev-sts", tmp_path / "empty"], "holds no STSBenchmark/sts-dev.csv"),
        (["--dev-sts", tmp_path / "nowhere"], f"no data folder at {tmp_path / 'nowhere'}"),
    ]:
        code, _, err = run(capsys, "fit", npy, "--pooling", "cls", "--out", tmp_path / "h",
                           "--logdir", tmp_path / "runs", "--epochs", "1", "--quiet", *args)
        lines = err.strip().splitlines()
        assert code == 1 and len(lines) == 1, err
        assert lines[0].startswith("bertflow: error: ") and message in lines[0], lines[0]
    assert not (tmp_path / "h").exists() and not (tmp_path / "runs").exists()
    # with --encoder, the embeddings' encoder is known (and loaded once): the dev set is scored
    import bertflow.training.job

    loads, load = [], bertflow.training.job.load_encoder
    monkeypatch.setattr(bertflow.training.job, "load_encoder",
                        lambda *a: loads.append(a) or load(*a))
    code, _, err = run(capsys, "fit", npy, "--pooling", "cls", "--out", tmp_path / "h",
                       "--encoder", tiny_encoder_dir, "--cache", tmp_path / "cache",
                       "--dev-sts", data, "--epochs", "1", *FIT)
    assert code == 0 and "dev Spearman" in err, err
    assert len(loads) == 1


@pytest.fixture(params=["as it comes", "at a digit boundary"])
def event_file_counter(request):
    """Torch numbers event files by a per-process counter after the second they are made in;
    a name ending in 10 sorts before one ending in 9. The second case sets the counter where a
    run's files cross such a boundary (a resumed run's hparams file once sorted first)."""
    if request.param == "at a digit boundary":
        from tensorboard.summary.writer import event_file_writer

        counter = event_file_writer._global_uid
        while len(str(counter._value + 2)) == len(str(counter._value)):
            counter.get()


def test_resume_continues_the_curves_and_may_extend_the_epochs(
    tmp_path, capsys, corpus_file, tiny_encoder_dir, monkeypatch, event_file_counter
):
    logdir, ckpt = tmp_path / "runs", tmp_path / "state.pt"
    base = ["fit", corpus_file, "--encoder", tiny_encoder_dir, "--cache", tmp_path / "cache",
            "--pooling", "cls", "--logdir", logdir, "--checkpoint", ckpt, *FIT]
    per_epoch = math.ceil(108 / 32)

    saves, real_save = [], torch.save

    def interrupt_second_save(obj, f):
        saves.append(f)
        if len(saves) == 2:
            raise KeyboardInterrupt
        real_save(obj, f)

    monkeypatch.setattr(torch, "save", interrupt_second_save)  # epoch 2 logged, not saved
    assert run(capsys, *base, "--epochs", "3", "--out", tmp_path / "a")[0] == 130
    monkeypatch.undo()
    code, _, err = run(capsys, *base, "--epochs", "3", "--out", tmp_path / "a", "--resume")
    assert code == 0, err
    [folder] = logdir.iterdir()
    acc = events(folder)
    for tag in PER_STEP:  # what the interrupted run logged after its checkpoint is purged
        assert steps(acc, tag) == list(range(1, 3 * per_epoch + 1)), tag
    assert steps(acc, "val/nll") == [per_epoch, 2 * per_epoch, 3 * per_epoch]

    shutil.copy(ckpt, tmp_path / "three-epochs.pt")
    code, _, err = run(capsys, *base, "--epochs", "5", "--out", tmp_path / "b", "--resume")
    assert code == 0, err
    assert "extending the run" in err and "from 3 to 5 epochs" in err
    assert list(logdir.iterdir()) == [folder]  # the same curves, continued
    acc = events(folder)
    total = 5 * per_epoch
    for tag in PER_STEP:
        assert steps(acc, tag) == list(range(1, total + 1)), tag
    assert steps(acc, "val/nll") == [per_epoch * k for k in range(1, 6)]
    lrs = {e.step: e.value for e in acc.Scalars("train/lr")}
    for s in range(3 * per_epoch + 1, total + 1):  # the cosine over the new total
        assert lrs[s] == pytest.approx(cosine_lr(1e-3, s, total))
    for s in range(1, 3 * per_epoch + 1):  # what the first 3 epochs ran under
        assert lrs[s] == pytest.approx(cosine_lr(1e-3, s, 3 * per_epoch))
    assert steps(acc, "hparams/best_val_nll") == [3 * per_epoch, total]
    extended = FlowHead.load(tmp_path / "b")
    assert extended.training_info["epochs_run"] == 5
    assert extended.training_info["config"]["epochs"] == 5
    assert torch.load(ckpt, weights_only=True)["state"]["epoch"] == 5

    # the extension is deterministic: again from the 3-epoch checkpoint, the same head
    shutil.copy(tmp_path / "three-epochs.pt", ckpt)
    code, _, err = run(capsys, *base, "--epochs", "5", "--out", tmp_path / "c", "--resume")
    assert code == 0, err
    for file in ("model.safetensors", "config.json"):
        assert (tmp_path / "b" / file).read_bytes() == (tmp_path / "c" / file).read_bytes()
    # a checkpoint of 5 epochs is not shortened, nor is a fresh start allowed to overwrite it
    for resume in (["--resume"], []):
        code, _, err = run(capsys, *base, "--epochs", "4", "--out", tmp_path / "d", *resume)
        assert code == 1 and "other settings" in err and not (tmp_path / "d").exists()


def test_a_continued_run_s_event_file_sorts_after_the_one_it_continues(tmp_path, monkeypatch):
    """TensorBoard reads event files in name order: the second they were made in, then the
    host, the process and its writer count (10 sorts before 9). A writer opened in the same
    second as an existing file waits for the next second, so its file sorts after."""
    from bertflow.training import tensorboard as logs

    now = int(time.time())
    (tmp_path / f"events.out.tfevents.{now:010d}.host.1.9").write_bytes(b"")
    (tmp_path / "events.out.tfevents.odd").write_bytes(b"")  # not ours: ignored
    logs._after_newest_events(tmp_path)
    assert int(time.time()) > now
    slept = []
    monkeypatch.setattr(logs.time, "sleep", slept.append)
    logs._after_newest_events(tmp_path / "empty")  # nothing there: no wait
    assert slept == []
    (tmp_path / f"events.out.tfevents.{now - 5:010d}.host.1.1").write_bytes(b"")
    logs._after_newest_events(tmp_path)  # the newest file is from a past second: no wait
    assert all(s == 0 for s in slept)
