import math

import numpy as np
import pytest
import torch

from bertflow import BertflowError, FlowConfig, Glow, TrainConfig, fit, fit_head
from bertflow.training.tensorboard import TensorBoard
from bertflow.training.trainer import TrainState, split_indices


def correlated_gaussian(n: int = 4000, d: int = 64, seed: int = 0) -> np.ndarray:
    g = torch.Generator().manual_seed(seed)
    mixing = torch.randn(d, d, generator=g) / math.sqrt(d)
    return (torch.randn(n, d, generator=g) @ mixing.T * 3 + 1).numpy()


def test_fit_whitens_a_correlated_gaussian():
    x = correlated_gaussian()
    before = np.linalg.norm(np.cov(x.T) - np.eye(64))
    head = fit_head(x, flow=FlowConfig(linear="lu"), train=TrainConfig(epochs=6, patience=0))
    z = head.transform(x)
    after = np.linalg.norm(np.cov(z.T) - np.eye(64))
    # sampling noise alone gives ‖cov − I‖_F ≈ 64 / sqrt(4000) ≈ 1.0
    assert before > 20
    assert after < 1.5
    assert np.abs(z.mean(0)).max() < 0.1


def test_same_seed_gives_identical_weights_and_other_seed_does_not():
    x = correlated_gaussian(600, 16)
    config = TrainConfig(epochs=2, seed=5)
    a = fit_head(x, flow=FlowConfig(levels=2, depth=2), train=config)
    b = fit_head(x, flow=FlowConfig(levels=2, depth=2), train=config)
    c = fit_head(x, flow=FlowConfig(levels=2, depth=2), train=TrainConfig(epochs=2, seed=6))
    for key, value in a.state_dict().items():
        assert torch.equal(value, b.state_dict()[key]), key
    assert any(not torch.equal(v, c.state_dict()[k]) for k, v in a.state_dict().items())


def test_resume_from_a_checkpoint_is_bit_identical():
    x = correlated_gaussian(500, 16)
    flow = FlowConfig(levels=2, depth=2, linear="lu")
    config = TrainConfig(epochs=4, patience=0, noise=0.01)
    full = fit_head(x, flow=flow, train=config)

    states: list[TrainState] = []
    fit_head(x, flow=flow, train=TrainConfig(**{**config.to_dict(), "epochs": 4}),
                 on_epoch_end=states.append)
    saved = states[1]  # interrupted after epoch 2
    buffer = __import__("io").BytesIO()
    torch.save(saved.to_dict(), buffer)
    buffer.seek(0)
    state = TrainState.from_dict(torch.load(buffer, weights_only=True))
    resumed = fit_head(x, flow=flow, train=config, state=state)
    assert [e["val_nll"] for e in resumed.history.epochs] == [
        e["val_nll"] for e in full.history.epochs
    ]
    for key, value in full.state_dict().items():
        assert torch.equal(value, resumed.state_dict()[key]), key


def test_release_optimiser_is_berts_adam_weight_decay():
    """bias_correction=False: Adam without bias correction, the decay added to the update
    (BERT's AdamWeightDecayOptimizer), checked against its formula over three steps."""
    from bertflow.training.trainer import _optimizer

    config = TrainConfig(lr=0.1, weight_decay=0.01, eps=1e-6, bias_correction=False)
    model = torch.nn.Linear(3, 1, bias=False)
    w = model.weight.detach().clone().double()
    m = v = torch.zeros_like(w)
    optimizer = _optimizer(model, config)
    for step in range(3):
        grad = torch.tensor([[1.0, -2.0, 0.5]]) * (step + 1)
        model.weight.grad = grad.clone()
        optimizer.step()
        m, v = 0.9 * m + 0.1 * grad, 0.999 * v + 0.001 * grad**2
        w = w - 0.1 * (m / (v.sqrt() + 1e-6) + 0.01 * w)
        assert torch.allclose(model.weight.double(), w, atol=1e-6)
    assert isinstance(_optimizer(model, TrainConfig()), torch.optim.Adam)
    assert isinstance(_optimizer(model, TrainConfig(weight_decay=0.01)), torch.optim.AdamW)


def test_release_optimiser_resumes_bit_identically():
    x = correlated_gaussian(300, 8)
    flow = FlowConfig(levels=2, depth=2)
    config = TrainConfig(epochs=3, patience=0, weight_decay=0.01, eps=1e-6,
                         bias_correction=False, max_grad_norm=1.0, schedule="constant")
    full = fit_head(x, flow=flow, train=config)
    states: list[TrainState] = []
    fit_head(x, flow=flow, train=config, on_epoch_end=states.append)
    resumed = fit_head(x, flow=flow, train=config, state=states[0])
    for key, value in full.state_dict().items():
        assert torch.equal(value, resumed.state_dict()[key]), key


def test_early_stopping_keeps_the_best_epoch():
    """Few rows, a wide conditioner and a high constant learning rate overfit at once."""
    x = correlated_gaussian(120, 8)
    config = TrainConfig(epochs=40, patience=2, lr=2e-2, batch_size=8, schedule="constant")
    head = fit_head(x, flow=FlowConfig(levels=1, depth=2, hidden=256, coupling="affine"),
                        train=config)
    history = head.history
    vals = [e["val_nll"] for e in history.epochs]
    assert history.stopped_early and len(vals) < 40
    assert len(vals) - history.best_epoch == 2
    assert history.best_val_nll == min(vals) == history.best["val_nll"]
    # the kept weights are the best epoch's, not the last
    _, val = split_indices(120, config.val_fraction, config.seed)
    kept = -head.log_prob(torch.from_numpy(x[val])).mean().item()
    assert kept == pytest.approx(history.best_val_nll, rel=1e-5)
    for record in history.epochs:
        assert record["val_bits_per_dim"] == pytest.approx(record["val_nll"] / (8 * math.log(2)))


def test_non_finite_loss_names_the_step():
    class Exploding(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.w = torch.nn.Parameter(torch.ones(()))

        def forward(self, x):
            scale = self.w * (1e30 if self.training and self.calls > 0 else 1.0)
            self.calls += 1
            return x * scale, torch.zeros(x.shape[0])

    model = Exploding()
    model.calls = 0
    with pytest.raises(BertflowError, match=r"non-finite loss \(inf\) at step 1 \(epoch 1\)"):
        fit(model, torch.randn(50, 4), TrainConfig(epochs=1, batch_size=8))


def test_nan_inputs_are_refused():
    x = correlated_gaussian(50, 4)
    x[7, 2] = np.nan
    with pytest.raises(BertflowError, match="NaN"):
        fit_head(x)


def test_writer_gets_loss_bits_log_det_cosines_and_histogram():
    class Recorder:
        def __init__(self):
            self.tags = set()

        def add_scalar(self, tag, value, step):
            assert math.isfinite(value)
            self.tags.add(tag)

        def add_histogram(self, tag, values, step):
            self.tags.add(tag)

    writer = Recorder()
    fit_head(correlated_gaussian(200, 8), flow=FlowConfig(levels=1, depth=2),
                 train=TrainConfig(epochs=1), hook=TensorBoard(writer))
    assert {
        "train/nll", "train/bits_per_dim", "train/log_det", "val/nll", "val/bits_per_dim",
        "val/log_det", "cosine/input", "cosine/latent", "latent/z",
    } <= writer.tags


def test_the_held_out_latents_kept_each_epoch_are_bounded_whatever_the_corpus():
    # the held-out sample a hook gets and val_cosine measures is what grows with the corpus in
    # fit's memory: at most 4,096 rows however many are held out (here 5,000)
    class Shapes:
        def __init__(self):
            self.seen = []

        def start(self, x):
            self.seen.append(tuple(x.shape))

        def scalars(self, step, values):
            pass

        def epoch(self, step, record, z):
            self.seen.append(tuple(z.shape))

    hook = Shapes()
    history = fit(Glow(4, FlowConfig(levels=1, depth=2)), correlated_gaussian(50_000, 4),
                  TrainConfig(epochs=1, batch_size=4096), hook=hook)
    assert hook.seen == [(4096, 4), (4096, 4)]
    assert math.isfinite(history.epochs[0]["val_cosine"])


def test_training_lowers_held_out_nll_below_the_initial_flow():
    x = torch.from_numpy(correlated_gaussian(2000, 16))
    glow = Glow(16, FlowConfig(levels=2, depth=2))
    config = TrainConfig(epochs=5, patience=0)
    _, val = split_indices(2000, config.val_fraction, config.seed)
    history = fit(glow, x, config)
    first, last = history.epochs[0]["val_nll"], history.best_val_nll
    assert last < first - 1.0
    assert -glow.log_prob(x[val]).mean().item() == pytest.approx(last, rel=1e-5)


def test_split_is_seeded_and_disjoint():
    train, val = split_indices(100, 0.1, seed=3)
    assert len(val) == 10 and len(train) == 90
    assert set(train.tolist()).isdisjoint(val.tolist())
    again = split_indices(100, 0.1, seed=3)
    assert torch.equal(train, again[0])
    assert [len(part) for part in split_indices(4, 0.1, seed=3)] == [3, 1]
    for n, fraction, left in ((2, 0.0, 2), (3, 0.1, 2), (100, 0.99, 1), (100, 0.98, 2)):
        with pytest.raises(BertflowError, match=f"need at least 3 training rows: {n} rows, "
                                                f"{n - left} of them held out .*, leave {left}$"):
            split_indices(n, fraction, seed=3)


def test_a_state_of_another_model_is_refused():
    x = correlated_gaussian(200, 8)
    states: list[TrainState] = []
    fit(Glow(8, FlowConfig(levels=1, depth=2)), x, on_epoch_end=states.append)
    with pytest.raises(BertflowError, match="the state does not fit this run"):
        fit(Glow(8, FlowConfig(levels=1, depth=3)), x, TrainConfig(epochs=2), state=states[0])


@pytest.mark.parametrize(
    "field,value,message",
    [
        ("epochs", 0, "epochs must be at least 1"),
        ("batch_size", 0, "batch_size must be at least 1"),
        ("patience", -1, "patience must be at least 0"),
        ("seed", 2**40, "seed must be in"),
        ("seed", -1, "seed must be in"),
        ("val_fraction", 1.0, "val_fraction"),
        ("lr", 0.0, "lr must be positive"),
        ("noise", -0.1, "noise"),
        ("schedule", "step", "schedule"),
        ("weight_decay", -0.01, "weight_decay must be ≥ 0"),
        ("eps", 0.0, "eps must be positive"),
    ],
)
def test_bad_train_configs_are_refused(field, value, message):
    with pytest.raises(BertflowError, match=message):
        TrainConfig(**{field: value})


def test_a_checkpoint_belongs_to_its_run_or_to_the_same_run_extended(tmp_path):
    from bertflow.training.checkpoint import Checkpoint, open_checkpoint
    from bertflow.training.trainer import History

    state = TrainState(1, 3, {}, {}, {}, History(), 0)
    run = {"train": {"epochs": 2, "seed": 0}, "data": "x"}
    saved = Checkpoint(state, run)
    longer = {"train": {"epochs": 5, "seed": 0}, "data": "x"}
    assert saved.extends(longer) and not saved.extends(run)
    assert not saved.extends({"train": {"epochs": 5, "seed": 1}, "data": "x"})
    saved.check("ckpt", run, extended=False)
    saved.check("ckpt", longer)
    with pytest.raises(BertflowError, match="other settings or data; not overwriting it"):
        saved.check("ckpt", longer, extended=False, keep=True)
    assert open_checkpoint(tmp_path / "absent.pt") is None
    (tmp_path / "notes.txt").write_text("mine")
    with pytest.raises(BertflowError, match="not a bertflow training checkpoint$"):
        open_checkpoint(tmp_path / "notes.txt")
