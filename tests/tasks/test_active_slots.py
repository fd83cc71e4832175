"""Fusion at the word slots in use only (FusedModel n_active, tasks/ner.py bounds): the same
logits at every slot in use, and bounds that no batch exceeds."""
import equinox as eqx
import jax
import numpy as np
import pytest

from jaxdepth.models.specs import EncoderConfig
from jaxdepth.data.corpus.pipeline import ExampleBatchSource
from jaxdepth.models.encoder import Encoder
from jaxdepth.models.fused import FusedModel
from jaxdepth.tasks.ner import eval_active_bound, slots_in_use, train_active_bound

B, T, P, V = 4, 16, 6, 50
ENC = EncoderConfig(vocab_size=V, d_model=32, n_layers=3, n_heads=2, d_ff=64, max_positions=T,
                    dropout=0.1)


def _batch():
    rng = np.random.default_rng(0)
    words = np.array([6, 1, 3, 0])  # a row may be all padding
    positions = np.zeros((B, P), np.int32)
    for b, w in enumerate(words):
        positions[b, :w] = np.sort(rng.choice(np.arange(1, T - 1), w, replace=False))
    tokens = rng.integers(6, V, (B, T)).astype(np.int32)
    return tokens, np.ones((B, T), bool), positions, words


@pytest.mark.parametrize("method, mode", [("dwatt", "fe"), ("concat", "ft")])
def test_logits_at_the_slots_in_use_do_not_change(method, mode):
    model = FusedModel(Encoder(ENC, key=jax.random.key(1)), method=method,
                       frozen_backbone=mode == "fe", n_labels=7, key=jax.random.key(2))
    tokens, mask, positions, words = _batch()
    used = positions > 0
    key = jax.random.key(3)  # dropout on: the masks must be the same draws
    logits = eqx.filter_jit(lambda m, n: m(tokens, None, mask, positions, key=key, n_active=n))
    n = int(words.sum())
    some = np.asarray(logits(model, n))
    # a larger bound only adds padding: the dropout masks are drawn per slot, so they do
    # not move with the packing
    np.testing.assert_allclose(np.asarray(logits(model, n + 5)), some, rtol=1e-6, atol=1e-6)
    # without dropout the packed path is the full one at every slot in use
    plain = eqx.filter_jit(lambda m, n: m(tokens, None, mask, positions, n_active=n))
    np.testing.assert_allclose(np.asarray(plain(model, n))[used],
                               np.asarray(plain(model, 0))[used], rtol=1e-6, atol=1e-6)
    assert not np.allclose(some[used], np.asarray(plain(model, n))[used], atol=1e-3)  # dropout acts
    # too small a bound drops slots in use (it is the caller's to give a true bound)
    short = np.asarray(plain(model, 2))
    assert not np.allclose(short[used], np.asarray(plain(model, 0))[used], atol=1e-3)
    # cached states, packed word by word by a WordCache: the same slots, the same numbers
    # and the same dropout masks (drawn per slot, not per packed position)
    if mode == "fe":
        from jaxdepth.tasks.state_cache import WordCache, fill

        states = eqx.filter_jit(lambda m: m.frozen_states(tokens, None, mask, positions))(model)
        cache = WordCache(positions)
        fill(cache, model, {"tokens": tokens, "segments": np.zeros_like(tokens),
                            "mask": mask.astype(np.int32), "positions": positions},
             B, jax.ShapeDtypeStruct(states.shape[1:], states.dtype), None)
        n = int(words.sum())
        packed, slots = cache.pack(np.arange(B), first_row=0, accum=1, micro_rows=B,
                                   per_micro=n + 3)
        cached = np.asarray(eqx.filter_jit(lambda m, w, s: m.logits_from_words(
            w, s, positions, key=key))(model, packed, slots))
        np.testing.assert_allclose(cached[used], some[used], rtol=1e-6, atol=1e-6)
        np.testing.assert_allclose(cached[~used], 0.0)


def test_train_bound_holds_for_every_batch_the_trainer_draws():
    rng = np.random.default_rng(0)
    for n, rows in ((40, 8), (5, 8), (3, 16), (17, 4), (48, 16)):
        slots = rng.integers(0, 12, n)
        positions = (np.arange(12)[None, :] < slots[:, None]).astype(np.int32)
        assert np.array_equal(slots_in_use({"positions": positions}), slots)
        bound = train_active_bound(slots, rows)
        src = ExampleBatchSource({"slots": slots}, global_batch=rows, seed=3)
        worst = max(int(src[i]["slots"].sum()) for i in range(300))
        assert worst <= bound <= max(1, rows * slots.max()), (n, rows, worst, bound)
    # hand numbers: 2 divides 4, so no batch straddles two epochs; 3 does not divide 4, so
    # the largest count may come twice
    assert train_active_bound(np.array([5, 1, 1, 1]), 2) == 6
    assert train_active_bound(np.array([5, 1, 1, 1]), 3) == 11


def test_eval_bound_is_the_largest_padded_batch():
    slots = np.array([3, 1, 4, 1, 5])  # batches [3, 1], [4, 1], [5, 5 (padding copy)]
    assert eval_active_bound(slots, 2) == 10
    assert eval_active_bound(np.array([0, 0]), 2) == 1


def test_compile_size_rounds_up_within_the_batch():
    from jaxdepth.tasks.ner import compile_size

    assert [compile_size(k, 1000) for k in (1, 64, 65, 700, 999)] == [64, 64, 128, 704, 1000]
    assert compile_size(70, 96) == 96
