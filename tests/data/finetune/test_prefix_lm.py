"""Prefix-LM features: explicit arrays by hand, the loss ignores the prefix, batching, packing,
unk."""
import jax.numpy as jnp
import numpy as np
import pytest

from jaxdepth.config import ModelConfig
from jaxdepth.data.finetune.prefix_lm_features import (batch_features, count_unk, pack_features,
                                                       prefix_lm_features)
from jaxdepth.data.finetune.seq2seq_readers import Example
from jaxdepth.data.corpus.tokenizer import train_tokenizer
from jaxdepth.models.decoder import DecoderLM
from jaxdepth.tasks.losses import lm_loss_sums


def test_hand_example():
    # sequence = [5, 6, EOS, 7, EOS]; the loss covers predicting 7 and the final EOS.
    f = prefix_lm_features([5, 6], [7], length=8)
    np.testing.assert_array_equal(f["targets"], [5, 6, 1, 7, 1, 0, 0, 0])
    np.testing.assert_array_equal(f["inputs"], [0, 5, 6, 1, 7, 1, 0, 0])
    np.testing.assert_array_equal(f["weights"], [0, 0, 0, 1, 1, 0, 0, 0])
    assert f["prefix_len"] == 3 and not f["truncated"]
    assert f["targets"].dtype == np.int32 and f["weights"].dtype == np.float32


def test_exact_fit_and_custom_eos():
    f = prefix_lm_features([5], [7, 8], length=5, eos_id=9)
    np.testing.assert_array_equal(f["targets"], [5, 9, 7, 8, 9])
    np.testing.assert_array_equal(f["inputs"], [0, 5, 9, 7, 8])
    np.testing.assert_array_equal(f["weights"], [0, 0, 1, 1, 1])


def test_too_long_is_an_error_naming_the_example():
    with pytest.raises(ValueError, match=r"train.tsv:3: .* = 6 tokens do not fit in length 5"):
        prefix_lm_features([5, 6], [7, 8], length=5, name="train.tsv:3")


def test_truncation_keeps_both_eos_and_shrinks_the_source_first():
    f = prefix_lm_features([5, 6, 7], [8, 9], length=5, truncate=True)
    np.testing.assert_array_equal(f["targets"], [5, 1, 8, 9, 1])
    np.testing.assert_array_equal(f["weights"], [0, 0, 1, 1, 1])
    assert f["truncated"] and f["prefix_len"] == 2
    g = prefix_lm_features([5], [6, 7, 8, 9], length=4, truncate=True)
    np.testing.assert_array_equal(g["targets"], [1, 6, 7, 1])
    np.testing.assert_array_equal(g["weights"], [0, 1, 1, 1])


def test_invalid_ids():
    with pytest.raises(ValueError, match="PAD/EOS"):
        prefix_lm_features([5, 1], [7], length=8)
    with pytest.raises(ValueError, match="empty target"):
        prefix_lm_features([5], [], length=8)


def test_weighted_loss_ignores_the_prefix():
    f = prefix_lm_features([5, 6, 4], [7, 3], length=10)
    targets, weights = jnp.asarray(f["targets"])[None], jnp.asarray(f["weights"])[None]
    rng = np.random.default_rng(0)
    logits = rng.normal(size=(1, 10, 12)).astype(np.float32)
    changed = logits.copy()
    off = f["weights"] == 0  # source, source EOS and padding positions
    changed[0, off] = rng.normal(size=(int(off.sum()), 12)) * 10
    loss = lm_loss_sums(jnp.asarray(logits), targets, weights)
    loss_changed = lm_loss_sums(jnp.asarray(changed), targets, weights)
    np.testing.assert_allclose(loss_changed[0], loss[0], rtol=1e-6)
    assert float(loss[2]) == 3.0  # two target tokens and the final EOS
    changed[0, f["prefix_len"]] += 5.0  # a target position does change it
    assert float(lm_loss_sums(jnp.asarray(changed), targets, weights)[0]) != float(loss[0])


@pytest.fixture(scope="module")
def tok():
    words = "a the cat dog saw owl mat on big small ran sat . passiv decl was seen by".split()
    rng = np.random.default_rng(0)
    return train_tokenizer([" ".join(rng.choice(words, 8)) for _ in range(300)], vocab_size=40)


def test_batch_features(tok):
    examples = [
        Example("the cat saw a dog . passiv", "a dog was seen by the cat .", "passiv", 1, "f"),
        Example("a owl sat . decl", "a owl sat .", "decl", 2, "f"),
    ]
    b = batch_features(examples, tok, length=40)
    assert b["inputs"].shape == b["targets"].shape == b["weights"].shape == (2, 40)
    assert b["inputs"].dtype == np.int32 and b["weights"].dtype == np.float32
    for i, e in enumerate(examples):
        src, tgt = tok.encode(e.source), tok.encode(e.target)
        one = prefix_lm_features(src, tgt, 40)
        for key in ("inputs", "targets", "weights"):
            np.testing.assert_array_equal(b[key][i], one[key])
        assert b["prefix_len"][i] == len(src) + 1
        assert tok.decode(b["targets"][i][b["weights"][i] > 0][:-1]) == e.target
    assert b["truncated"].sum() == 0
    # 14 + 15 + 2 and 9 + 8 + 2 tokens: only the first example exceeds 20.
    assert [len(tok.encode(e.source)) for e in examples] == [14, 9]
    assert [len(tok.encode(e.target)) for e in examples] == [15, 8]
    short = batch_features(examples, tok, length=20, truncate=True)
    assert short["truncated"].tolist() == [1, 0] and short["prefix_len"].tolist() == [4, 10]
    with pytest.raises(ValueError, match="f:1: "):
        batch_features(examples, tok, length=20)


def _examples(n, seed):
    words = "a the cat dog saw owl mat on big small ran sat".split()
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        src = " ".join(rng.choice(words, rng.integers(1, 7)))
        tgt = " ".join(rng.choice(words, rng.integers(1, 5)))
        out.append(Example(src, tgt, "in_distribution", i + 1, "f"))
    return out


def test_pack_features_holds_every_example_once_as_its_unpacked_features(tok):
    examples = _examples(40, 0)
    p = pack_features(examples, tok, 64, seed=3)
    n_rows = len(p["inputs"])
    assert set(p) == {"inputs", "targets", "weights", "segment_ids"}
    assert p["segment_ids"].dtype == np.int32 and p["weights"].dtype == np.float32
    seen = []
    for r in range(n_rows):
        segs = p["segment_ids"][r]
        k = segs.max()
        assert k >= 1 and (segs[segs > 0] == np.sort(segs[segs > 0])).all()  # contiguous
        assert (p["targets"][r][segs == 0] == 0).all() and (p["weights"][r][segs == 0] == 0).all()
        for seg in range(1, k + 1):
            at = segs == seg
            src = tok.decode(p["targets"][r][at][:int(np.argmax(p["targets"][r][at] == 1))])
            i = next(j for j, e in enumerate(examples) if e.source == src and j not in seen)
            seen.append(i)
            one = prefix_lm_features(tok.encode(examples[i].source), tok.encode(examples[i].target),
                                     int(at.sum()))
            for key in ("inputs", "targets", "weights"):
                np.testing.assert_array_equal(p[key][r][at], one[key])
    assert sorted(seen) == list(range(40))
    total = sum(len(tok.encode(e.source)) + len(tok.encode(e.target)) + 2 for e in examples)
    assert total == int((p["segment_ids"] > 0).sum())
    assert n_rows <= -(-total // 64) + 1  # best fit leaves at most about one row of room
    again = pack_features(examples, tok, 64, seed=3)
    assert all((again[k] == p[k]).all() for k in p)
    other = pack_features(examples, tok, 64, seed=4)
    assert any(other[k].shape != p[k].shape or (other[k] != p[k]).any() for k in p)
    with pytest.raises(ValueError, match="f:"):
        pack_features(examples + [Example("a " * 40, "cat " * 40, "x", 41, "f")], tok, 64, seed=0)


def test_packed_loss_equals_the_unpacked_loss(tok, getkey):
    """Attention inside segments and a shift-invariant position bias: the summed NLL of a
    packed batch is that of the same examples one per row. Without segment ids it is not."""
    examples = _examples(12, 1)
    model = DecoderLM(ModelConfig(vocab_size=40, d_model=32, n_layers=2, d_ff=64, n_heads=2,
                                  rel_buckets=8, rel_max_distance=16), key=getkey())
    one = batch_features(examples, tok, 48)
    packed = pack_features(examples, tok, 96, seed=0)
    assert len(packed["inputs"]) < len(examples)
    nll_one, n_one = lm_loss_sums(model(jnp.asarray(one["inputs"])), jnp.asarray(one["targets"]),
                                  jnp.asarray(one["weights"]))[1:]
    logits = model(jnp.asarray(packed["inputs"]), segment_ids_BT=jnp.asarray(packed["segment_ids"]))
    nll_p, n_p = lm_loss_sums(logits, jnp.asarray(packed["targets"]), jnp.asarray(packed["weights"]))[1:]
    assert float(n_p) == float(n_one)
    np.testing.assert_allclose(float(nll_p), float(nll_one), rtol=1e-5)
    leaky = model(jnp.asarray(packed["inputs"]))  # attends across examples
    nll_leak = lm_loss_sums(leaky, jnp.asarray(packed["targets"]), jnp.asarray(packed["weights"]))[1]
    assert abs(float(nll_leak) - float(nll_one)) > 1e-3 * float(nll_one)


def test_count_unk_reports_the_unknown_words(tok):
    examples = [Example("the cat saw a dog .", "see ( cat , dog )", "in_distribution", 1, "f"),
                Example("a owl sat .", "a owl sat .", "in_distribution", 2, "f")]
    report = count_unk(examples, tok)
    assert report.n_examples == 2 and report.examples_with_unk == 1 and not report.ok
    assert report.source_unk_tokens == 0 and report.target_unk_tokens >= 1
    assert "(" in report.unknown_words and ")" in report.unknown_words
    assert count_unk(examples[1:], tok).ok
