import os
from pathlib import Path

# The suite's torch work runs on one thread, in this process and the commands it starts: on a
# loaded machine, OpenMP threads that wait for each other's core slow a test tenfold or more.
# A test about threads sets its own.
for _name in ("OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ[_name] = "1"

import pytest  # noqa: E402
import torch  # noqa: E402
from transformers import BertConfig, BertModel, BertTokenizerFast  # noqa: E402

torch.set_num_threads(1)

WORDS = (
    "a the man woman dog cat is are was plays playing guitar piano runs running park "
    "in on with and to of big small red blue green house car street music eats food"
).split()

SENTENCES = [
    "a man plays the guitar",
    "the dog runs in the park",
    "a woman is playing piano",
    "the small cat eats food",
    "a big red car",
    "music",
    "the man and the woman are running on the street with a blue dog",
    "a green house",
]

REPO = Path(__file__).resolve().parent.parent


def data_dir() -> Path:
    """The evaluation data: $BERTFLOW_DATA, else data/ in the checkout (`make data` links it)."""
    return Path(os.environ.get("BERTFLOW_DATA") or REPO / "data")


def make_tiny_encoder(folder: Path, hidden: int = 16, layers: int = 3, seed: int = 0,
                      heads: int = 2) -> Path:
    """Save a randomly initialised tiny BERT and its tokenizer to `folder`."""
    folder.mkdir(parents=True, exist_ok=True)
    vocab = folder / "vocab.txt"
    vocab.write_text("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *WORDS]) + "\n")
    tokenizer = BertTokenizerFast(vocab=str(vocab), do_lower_case=True)
    config = BertConfig(
        vocab_size=len(WORDS) + 5,
        hidden_size=hidden,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        intermediate_size=2 * hidden,
        max_position_embeddings=64,
    )
    torch.manual_seed(seed)
    model = BertModel(config)
    # 128 positions, as many as the default max length; the first 64 and the other weights
    # are those drawn for 64, and the rest are drawn after them
    extra = torch.randn(128 - 64, hidden) * config.initializer_range
    config.max_position_embeddings = 128
    longer = BertModel(config)
    positions = model.embeddings.position_embeddings.weight.detach()
    longer.load_state_dict({**model.state_dict(),
                            "embeddings.position_embeddings.weight": torch.cat([positions, extra])})
    longer.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    assert tokenizer.unk_token_id not in tokenizer(" ".join(WORDS))["input_ids"]
    return folder


def make_tiny_kind(folder: Path, kind: str, seed: int = 0, **changes) -> Path:
    """Save a randomly initialised model of transformers' `kind` (hidden 32, 2 layers, 4
    heads, padding id 0; `changes` to its config) with the tiny BERT tokenizer to `folder`."""
    import transformers

    folder.mkdir(parents=True, exist_ok=True)
    vocab = folder / "vocab.txt"
    vocab.write_text("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *WORDS]) + "\n")
    BertTokenizerFast(vocab=str(vocab), do_lower_case=True).save_pretrained(folder)
    config = transformers.AutoConfig.for_model(
        kind, **{"vocab_size": len(WORDS) + 5, "hidden_size": 32, "num_hidden_layers": 2,
                 "num_attention_heads": 4, "intermediate_size": 64,
                 "max_position_embeddings": 128, "pad_token_id": 0, **changes})
    torch.manual_seed(seed)
    transformers.AutoModel.from_config(config).save_pretrained(folder)
    return folder


def make_tiny_mpnet(folder: Path, hidden: int = 16, layers: int = 3, seed: int = 0) -> Path:
    """Save a randomly initialised tiny MPNet (relative position bias, padding id 1, no token
    types) and its tokenizer to `folder`."""
    from transformers import MPNetConfig, MPNetModel, MPNetTokenizerFast

    folder.mkdir(parents=True, exist_ok=True)
    vocab = folder / "vocab.txt"
    vocab.write_text("\n".join(["<s>", "<pad>", "</s>", "<unk>", "[UNK]", "<mask>", *WORDS]) + "\n")
    tokenizer = MPNetTokenizerFast(vocab=str(vocab), do_lower_case=True)
    config = MPNetConfig(vocab_size=len(WORDS) + 6, hidden_size=hidden, num_hidden_layers=layers,
                         num_attention_heads=2, intermediate_size=2 * hidden,
                         max_position_embeddings=130)
    torch.manual_seed(seed)
    MPNetModel(config, add_pooling_layer=False).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    assert tokenizer.pad_token_id == 1 and tokenizer.unk_token_id not in tokenizer(" ".join(WORDS))[
        "input_ids"]
    return folder


def mpnet_dir() -> Path:
    """The real all-mpnet-base-v2 folder (`make mpnet` fetches it): $BERTFLOW_MPNET, else
    ~/.cache/bertflow/encoders/all-mpnet-base-v2."""
    default = Path.home() / ".cache" / "bertflow" / "encoders" / "all-mpnet-base-v2"
    return Path(os.environ.get("BERTFLOW_MPNET", default))


@pytest.fixture(scope="session")
def tiny_mpnet_dir(tmp_path_factory) -> Path:
    return make_tiny_mpnet(tmp_path_factory.mktemp("tiny-mpnet"))


@pytest.fixture(scope="session")
def tiny_encoder_dir(tmp_path_factory) -> Path:
    return make_tiny_encoder(tmp_path_factory.mktemp("tiny-bert"))


@pytest.fixture(scope="session")
def other_encoder_dir(tmp_path_factory) -> Path:
    """Same shape as the tiny encoder, other weights."""
    return make_tiny_encoder(tmp_path_factory.mktemp("tiny-bert-other"), seed=1)


@pytest.fixture(scope="session")
def wide_encoder_dir(tmp_path_factory) -> Path:
    """A tiny encoder of another width."""
    return make_tiny_encoder(tmp_path_factory.mktemp("tiny-bert-wide"), hidden=24, seed=2)


@pytest.fixture(scope="session")
def tiny_encoder(tiny_encoder_dir):
    from bertflow import load_encoder

    return load_encoder(tiny_encoder_dir)


@pytest.fixture
def corpus_file(tmp_path) -> Path:
    path = tmp_path / "corpus.txt"
    rng = torch.Generator().manual_seed(0)
    lines = []
    for _ in range(120):
        n = int(torch.randint(2, 9, (1,), generator=rng))
        idx = torch.randint(len(WORDS), (n,), generator=rng)
        lines.append(" ".join(WORDS[i] for i in idx))
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def fit_tiny_head(encoder, pooling: str, seed: int = 0, max_length: int = 32):
    """A small head fit on the tiny encoder's embeddings of a few hundred word salads."""
    import numpy as np

    from bertflow import FlowConfig, TrainConfig, fit_head

    rng = np.random.default_rng(seed)
    lines = [" ".join(rng.choice(WORDS, size=rng.integers(2, 9))) for _ in range(200)]
    x = encoder.encode(lines + SENTENCES, pooling, max_length=max_length)
    return fit_head(x, encoder=encoder.id, pooling=pooling, max_length=max_length,
                        flow=FlowConfig(levels=2, depth=2, linear="lu"),
                        train=TrainConfig(epochs=2, seed=seed))


def swap_after(monkeypatch, module, name: str, a: Path, b: Path, when=lambda *args: True):
    """Make `module.name` exchange folders `a` and `b` (a folder replaced by another) just after
    its first call whose arguments `when` accepts: a reader caught between two versions."""
    real, swapped = getattr(module, name), []

    def call(*args, **kwargs):
        result = real(*args, **kwargs)
        if not swapped and when(*args):
            swapped.append(True)
            a.rename(a.with_name("swapping"))
            b.rename(a)
            a.with_name("swapping").rename(b)
        return result

    monkeypatch.setattr(module, name, call)
    return swapped


@pytest.fixture(autouse=True, scope="session")
def private_cache(tmp_path_factory):
    """Commands that default to the user's embedding cache use a throwaway one in tests."""
    old = os.environ.get("BERTFLOW_CACHE")
    os.environ["BERTFLOW_CACHE"] = str(tmp_path_factory.mktemp("bertflow-cache"))
    yield
    if old is None:
        os.environ.pop("BERTFLOW_CACHE", None)
    else:
        os.environ["BERTFLOW_CACHE"] = old
