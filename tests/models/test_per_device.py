"""Models.per_device (jax.shard_map over the models' mesh) on the suite's 8 CPU devices: greedy
decoding of one model, of 8 trials split over the data axis and of 2 trials on every device
gives each prompt the tokens `generate` gives it on one device; ACT's while loop stops on each
device when its own rows have halted (one loop over the batch runs until the last token
anywhere has)."""
import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from jaxdepth.config import ModelConfig
from jaxdepth.models.act import ACTConfig, ACTEncoder
from jaxdepth.models.decoder import DecoderLM, generate
from jaxdepth.tasks.decoding import _greedy
from jaxdepth.models.trial_axis import Models

CFG = ModelConfig(vocab_size=40, d_model=32, n_layers=2, d_ff=48, n_heads=2)
MAX_NEW = 6
pytestmark = pytest.mark.fake_devices


@pytest.fixture
def mesh():
    if jax.device_count() < 8:
        pytest.skip("needs the suite's 8 CPU devices (conftest.py)")
    return Mesh(np.asarray(jax.devices()[:8]), ("data",))


def _prompts(n: int, seed: int = 0):
    rng = np.random.default_rng(seed)
    lengths = rng.integers(2, 7, n).astype(np.int32)
    prompts = np.zeros((n, 8), np.int32)
    for i, n_i in enumerate(lengths):
        prompts[i, :n_i] = rng.integers(2, CFG.vocab_size, n_i)
    return prompts, lengths


def _stacked(k: int):
    return eqx.filter_vmap(lambda key: DecoderLM(CFG, key=key))(
        jax.random.split(jax.random.key(3), k))


def _one_device(model: DecoderLM, prompts, lengths):
    """The reference: every prompt decoded on one device, two at a time (rows never interact
    in greedy decoding, but a batch's loop runs to its slowest row)."""
    return np.concatenate([np.asarray(generate(model, prompts[i:i + 2], lengths[i:i + 2], MAX_NEW))
                           for i in range(0, len(prompts), 2)])


@pytest.mark.parametrize("k, sharded, rows", [(1, False, 13), (8, True, 6), (2, False, 16)],
                         ids=["one-model-13-rows-over-8", "8-trials-over-data", "2-trials-each"])
def test_decoding_on_each_device_equals_decoding_on_one(mesh, k, sharded, rows):
    stacked = _stacked(k)
    prompts, lengths = _prompts(rows)
    want = [_one_device(jax.tree.map(lambda x: x[i] if eqx.is_array(x) else x, stacked),
                        prompts, lengths) for i in range(k)]
    spec = NamedSharding(mesh, P("data") if sharded else P())
    placed = eqx.combine(jax.device_put(eqx.filter(stacked, eqx.is_array), spec),
                         eqx.filter(stacked, eqx.is_array, inverse=True))
    models = Models(placed, k) if k > 1 else Models(jax.tree.map(
        lambda x: x[0] if eqx.is_array(x) else x, placed))
    got = models.per_device(_greedy, (prompts, lengths), MAX_NEW)
    assert len(got) == k
    for i in range(k):
        np.testing.assert_array_equal(np.asarray(got[i]), want[i], err_msg=f"model {i}")
    assert not all(np.all(w == want[0][:1]) for w in want[0])  # the prompts' tokens differ


# ------------------------------------------------------------------------------- ACT

ACT = ACTConfig(vocab_size=50, embed_dim=16, d_model=32, n_heads=2, d_ff=48, max_len=16,
                max_iters=6, tau=1e-2)


def _iterations(model: ACTEncoder, tokens, segments, mask):
    out = model.forward_while(tokens, segments, mask)
    return out.N_BT, jnp.broadcast_to(out.iterations_run, tokens.shape[:1])


def test_act_while_loop_stops_on_each_device_when_its_own_rows_have_halted(mesh):
    """One row per device, of lengths 0 to 7 (a row of no tokens has nothing to iterate): each
    device runs as many iterations as its own row's slowest token, and every token's N is the
    one-device loop's; the one-device loop over the batch runs the most of them."""
    model = ACTEncoder(ACT, key=jax.random.key(0))
    rng = np.random.default_rng(1)
    tokens = rng.integers(3, ACT.vocab_size, (8, 8)).astype(np.int32)
    mask = (np.arange(8)[None, :] < np.arange(8)[:, None]).astype(np.int32)
    segments = np.zeros_like(tokens)
    whole = model.forward_while(jnp.asarray(tokens), jnp.asarray(segments), jnp.asarray(mask))
    placed = jax.device_put(model, NamedSharding(mesh, P()))
    (N, ran), = Models(placed).per_device(_iterations, (tokens, segments, mask))
    np.testing.assert_array_equal(np.asarray(N), np.asarray(whole.N_BT))
    own = np.asarray(N).max(axis=1)
    np.testing.assert_array_equal(np.asarray(ran), own)
    assert own[0] == 0 and len(set(own.tolist())) > 1, own  # the devices stopped apart
    assert int(whole.iterations_run) == own.max() > own.min()


def test_trials_that_share_arrays_decode_as_each_trial_alone(mesh):
    """Two trials sharing their layers (one copy, Models.shared, as a frozen backbone is):
    each decodes as its own model, its arrays with the shared ones, on one device."""
    stacked = _stacked(2)
    ones = [jax.tree.map(lambda x: x[i] if eqx.is_array(x) else x, stacked) for i in range(2)]
    spec = eqx.tree_at(lambda m: m.blocks, jax.tree.map(lambda _: False, ones[0]), True)
    shared = eqx.filter(ones[0], spec)
    own = [eqx.filter(m, spec, inverse=True) for m in ones]
    stacked_own = jax.tree.map(lambda *xs: jnp.stack(xs), *own)
    prompts, lengths = _prompts(6, seed=2)
    want = [_one_device(eqx.combine(o, shared), prompts, lengths) for o in own]
    placed = jax.device_put(stacked_own, NamedSharding(mesh, P()))
    got = Models(placed, 2, shared).per_device(_greedy, (prompts, lengths), MAX_NEW)
    for i in range(2):
        np.testing.assert_array_equal(np.asarray(got[i]), want[i], err_msg=f"trial {i}")
    assert not np.array_equal(want[0], want[1])  # the trials' own arrays differ
