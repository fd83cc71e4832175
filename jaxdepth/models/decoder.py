"""T5.1.1-style decoder-only LM (t5x examples/decoder_only), layers stacked and scanned.

The layers are one stack (models/stack.py): built with ``eqx.filter_vmap`` and run with
``lax.scan``, or a Python loop when ``cfg.scan_layers=False``.
"""
from __future__ import annotations

import equinox as eqx
import equinox.internal as eqxi
import jax
import jax.numpy as jnp
from jaxtyping import Array

from .config import ModelConfig
from .depth_family import param_count
from .trial_tracing import may_drop
from .backbone import Backbone
from .flops import train_flops_per_token
from .layers import DecoderBlock, PostLNLayer, RelativePositionBias, RMSNorm, dropout, kernel_init
from .stack import init_stack, run_stack


def error_if(x: Array, pred: Array, msg: str) -> Array:
    """x, once `pred` (any element true) is false; else the computation fails with `msg`
    (raised on the host: a jax runtime error whose text ends with it). As ``eqx.error_if``, but
    also where each device computes on its own under ``jax.shard_map`` with ``check_vma``:
    there a value that differs by device is typed as varying, and equinox's failing branch
    returns an invariant one, which the check refuses at trace time. As equinox's, the predicate
    is reduced over any vmapped axis first (``unvmap_any``), so that the failing branch runs
    only when some element fails, also under vmap."""
    def raises(_):
        raise ValueError(msg)

    def fail():
        out = jax.pure_callback(raises, jax.ShapeDtypeStruct(x.shape, x.dtype), x,
                                vmap_method="broadcast_all")
        return out + jnp.zeros_like(x)  # typed as x: varying over the devices x varies over

    return jax.lax.cond(eqxi.unvmap_any(jnp.any(pred)), fail, lambda: x)


def cast_floating(tree, dtype):
    return jax.tree.map(
        lambda x: x.astype(dtype) if eqx.is_inexact_array(x) else x, tree)


def padded_d_ff(cfg: ModelConfig) -> int:
    """The width the decoder computes its feed-forward blocks at: d_ff rounded up to a multiple
    of model.d_ff_multiple, whose -1 is 128 on a GPU/TPU (where odd widths are slow matmul
    shapes) and 1 on the CPU (where they cost nothing, and unpadded runs stay bit-identical)."""
    multiple = cfg.d_ff_multiple
    if multiple == -1:
        multiple = 1 if jax.default_backend() == "cpu" else 128
    return -(-cfg.d_ff // multiple) * multiple


class KVCache(eqx.Module):
    k_LBSNH: Array
    v_LBSNH: Array
    pos_B: Array  # next position to write, per example

    @property
    def max_len(self) -> int:
        return self.k_LBSNH.shape[2]


class DecoderLM(Backbone):
    AXES = {"embed": ("vocab", "embed"), "lm_head": ("embed", "vocab")}
    embed: Array  # [V, D], N(0, 1)
    blocks: DecoderBlock  # every leaf has a leading layer axis L
    rel_bias: RelativePositionBias
    final_norm: RMSNorm
    lm_head: Array  # [D, V], untied from the embedding
    cfg: ModelConfig = eqx.field(static=True)
    dropout_setting = "model.dropout"

    def __init__(self, cfg: ModelConfig, *, key: Array):
        ke, kb, kr, kh = jax.random.split(key, 4)
        self.embed = jax.random.normal(ke, (cfg.vocab_size, cfg.d_model), jnp.float32)
        self.blocks = init_stack(lambda k: DecoderBlock(cfg, key=k), cfg.n_layers, key=kb)
        self.rel_bias = RelativePositionBias(cfg.rel_buckets, cfg.heads, cfg.rel_max_distance,
                                             key=kr)
        self.final_norm = RMSNorm(cfg.d_model)
        self.lm_head = kernel_init(kh, (cfg.d_model, cfg.vocab_size), jnp.float32)
        self.cfg = cfg

    def flops_per_token(self, seq_len: int) -> int:
        return train_flops_per_token(self.cfg, seq_len)

    def param_count(self) -> int:
        """Counted from its config (depth_family.py), as the depth-family tables count it."""
        return param_count(self.cfg)

    @property
    def compute_dtype(self):
        return jnp.dtype(self.cfg.compute_dtype)

    def compute_blocks(self) -> DecoderBlock:
        """The blocks as the forward runs them: in the compute dtype, their MLPs padded to
        ``padded_d_ff`` (the stored weights keep d_ff, so parameter counts, checkpoints and
        the optimizer's statistics are the unpadded model's)."""
        blocks = cast_floating(self.blocks, self.compute_dtype)
        return eqx.tree_at(lambda b: b.mlp, blocks, blocks.mlp.padded(padded_d_ff(self.cfg)))

    # ------------------------------------------------------------------ as a Backbone

    def layer_states(self, tokens_BT: Array, segments_BT: Array | None = None,
                     mask_BT: Array | None = None, *, key: Array | None = None) -> Array:
        """Every layer's output [L, B, T, D] (causal, before the final norm); segments and the
        padding mask do not apply to a causal LM whose padding comes last."""
        return self.hidden(tokens_BT, key=key, all_layers=True)[1]

    def post_ln_layer(self, *, key: Array) -> PostLNLayer:
        """A fresh post-LN layer for Base+n with the decoder's own activation (T5.1.1's tanh
        GELU) and norm eps (1e-6); its MLP is BERT's ungated one."""
        return PostLNLayer(self.cfg.d_model, self.cfg.heads, self.cfg.d_ff, eps=1e-6,
                           activation="gelu_new", key=key)

    # ------------------------------------------------------------------ forward

    def _run_layers(self, x_BTD: Array, bias_NTT: Array, key: Array | None,
                    all_layers: bool, segment_ids_BT: Array | None = None
                    ) -> tuple[Array, Array | None]:
        cfg = self.cfg
        rate = self.dropout_rate
        train = key is not None and may_drop(rate)
        # A scan of one or two layers only adds loop overhead (stacked residuals, dynamic
        # slices); unrolling it keeps compile time flat where depth is what we vary.
        unroll = cfg.scan_unroll or (cfg.n_layers if cfg.n_layers <= 2 else 1)
        return run_stack(self.compute_blocks(), x_BTD,
                         lambda block, x, k: block(x, bias_NTT, rate, k, cfg.attention,
                                                   segment_ids_BT),
                         keys=jax.random.split(key, cfg.n_layers) if train else None,
                         scan=cfg.scan_layers, remat=cfg.remat, unroll=unroll,
                         all_layers=all_layers)

    def hidden(self, tokens_BT: Array, *, key: Array | None = None, all_layers: bool = False,
               segment_ids_BT: Array | None = None) -> tuple[Array, Array | None]:
        """Final normed hidden states [B, T, D] and, if asked, every layer's output [L, B, T, D].

        ``segment_ids_BT``: which packed document each position holds (seqio's
        decoder_segment_ids; not BERT's token types). Attention then stays inside a document;
        None is one stream, attended causally across document boundaries."""
        k_emb, k_layers, k_out = (None,) * 3 if key is None else jax.random.split(key, 3)
        x_BTD = self.embed.astype(self.compute_dtype)[tokens_BT]
        rate = self.dropout_rate
        x_BTD = dropout(x_BTD, rate, k_emb)
        pos_T = jnp.arange(tokens_BT.shape[1])
        bias_NTT = self.rel_bias(pos_T, pos_T).astype(self.compute_dtype)
        x_BTD, layers = self._run_layers(x_BTD, bias_NTT, k_layers, all_layers, segment_ids_BT)
        x_BTD = dropout(self.final_norm(x_BTD), rate, k_out)
        return x_BTD, layers

    def logits(self, x_BTD: Array) -> Array:
        head = self.lm_head.astype(self.compute_dtype)
        return jnp.einsum("btd,dv->btv", x_BTD, head, preferred_element_type=jnp.float32)

    def __call__(self, tokens_BT: Array, *, key: Array | None = None,
                 segment_ids_BT: Array | None = None) -> Array:
        """Logits [B, T, V] in float32. Dropout is active iff a key is given; packed documents
        (``segment_ids_BT``) never attend to each other."""
        x_BTD, _ = self.hidden(tokens_BT, key=key, segment_ids_BT=segment_ids_BT)
        return self.logits(x_BTD)

    # ------------------------------------------------------------------ incremental decoding

    def init_cache(self, batch: int, max_len: int) -> KVCache:
        cfg = self.cfg
        shape = (cfg.n_layers, batch, max_len, cfg.heads, cfg.head_dim)
        zeros = jnp.zeros(shape, self.compute_dtype)
        return KVCache(zeros, zeros, jnp.zeros((batch,), jnp.int32))

    def extend(self, tokens_BT: Array, cache: KVCache) -> tuple[Array, KVCache]:
        """Run T new tokens per example at positions cache.pos_B.. ; logits [B, T, V].

        Rows of a batch may sit at different positions (prompts of different lengths), so the
        causal mask and the relative-position bias are built per example.
        """
        T = tokens_BT.shape[1]
        if T > cache.max_len:
            raise ValueError(f"KV cache overflow: {T} new tokens, max_len {cache.max_len}")
        # dynamic_update_slice would silently shift an overflowing write; fail loudly instead.
        tokens_BT = error_if(tokens_BT, jnp.any(cache.pos_B + T > cache.max_len),
                                 "KV cache overflow: position + new tokens exceeds max_len")
        x_BTD, bias_BNTS, mask_BNTS = self._decode_inputs(tokens_BT, cache.pos_B, cache.max_len)
        params, static = eqx.partition(self.compute_blocks(), eqx.is_array)

        def body(x, layer):
            p, k_c, v_c = layer
            x, k_c, v_c = eqx.combine(p, static).decode(x, bias_BNTS, mask_BNTS, k_c, v_c,
                                                        cache.pos_B)
            return x, (k_c, v_c)

        x_BTD, (k_new, v_new) = jax.lax.scan(body, x_BTD, (params, cache.k_LBSNH, cache.v_LBSNH))
        logits = self.logits(self.final_norm(x_BTD))
        return logits, KVCache(k_new, v_new, cache.pos_B + T)

    def _decode_inputs(self, tokens_BT: Array, pos_B: Array, S: int):
        """Embeddings of tokens written at positions pos_B.., with the relative-position bias
        [B, N, T, S] and causal mask [B, 1, T, S] over S cache slots, built per example (rows
        may sit at different positions)."""
        q_pos_BT = pos_B[:, None] + jnp.arange(tokens_BT.shape[1])[None, :]
        k_pos_S = jnp.arange(S)
        bias_BNTS = self.rel_bias(q_pos_BT, k_pos_S).astype(self.compute_dtype)
        mask_B1TS = (k_pos_S[None, None, :] <= q_pos_BT[:, :, None])[:, None]
        return self.embed.astype(self.compute_dtype)[tokens_BT], bias_BNTS, mask_B1TS

    def layer_list(self) -> list[DecoderBlock]:
        """The stacked blocks as one module per layer, in the compute dtype as `extend` runs
        them (decoding runs them one by one)."""
        params, static = eqx.partition(self.compute_blocks(), eqx.is_array)
        return [eqx.combine(jax.tree.map(lambda a: a[i], params), static)
                for i in range(self.cfg.n_layers)]

    def next_token(self, tok_B: Array, layers: list[DecoderBlock],
                   caches: tuple[tuple[Array, Array], ...], pos_B: Array
                   ) -> tuple[Array, tuple[tuple[Array, Array], ...]]:
        """One decoding step: logits [B, V] of the tokens `tok_B` written at positions pos_B,
        and every layer's (k, v) cache [B, S, N, H] with them written in. The same numbers as
        `extend` with T = 1 (tested); the caller checks the cache has room."""
        x_B1D, bias_BN1S, mask_B11S = self._decode_inputs(tok_B[:, None], pos_B,
                                                          caches[0][0].shape[1])
        out = []
        for layer, (k_c, v_c) in zip(layers, caches):
            x_B1D, k_c, v_c = layer.decode(x_B1D, bias_BN1S, mask_B11S, k_c, v_c, pos_B)
            out.append((k_c, v_c))
        return self.logits(self.final_norm(x_B1D))[:, 0], tuple(out)


def prefill(model: DecoderLM, prompt_BT: Array, lengths_B: Array,
            cache: KVCache) -> tuple[Array, KVCache]:
    """Fill the cache with right-padded prompts; logits of each prompt's last token [B, V].

    Padding past a prompt's length is written to the cache but sits at positions the next
    decoding steps overwrite before anything attends to them.
    """
    lengths_B = error_if(lengths_B, jnp.any((lengths_B < 1) | (lengths_B > prompt_BT.shape[1])),
                             "prompt lengths must be in [1, prompt width]")
    logits_BTV, cache = model.extend(prompt_BT, cache)
    last = jnp.take_along_axis(logits_BTV, (lengths_B - 1)[:, None, None], axis=1)[:, 0]
    return last, KVCache(cache.k_LBSNH, cache.v_LBSNH, lengths_B.astype(jnp.int32))


@eqx.filter_jit
def generate(model: DecoderLM, prompt_BT: Array, lengths_B: Array, max_new: int, *,
             key: Array | None = None, eos_id: int = 1, pad_id: int = 0) -> Array:
    """[B, max_new] continuations of right-padded prompts with a KV cache: argmax, or with a
    `key` a sample (temperature 1; token i drawn with ``fold_in(key, i)``). Each row stops
    after its first EOS (later slots hold pad_id); the loop ends once every row has stopped,
    under vmap (trials side by side) every row of every member: the predicate is reduced over
    the vmapped axes (``unvmap_all``), as a batched one would select every carry, KV caches
    included, on every token (about 2x slower on the CPU than decoding the members one by
    one). A member whose rows have all stopped only writes pad_id, so each member's tokens
    are its own either way.
    """
    B, T = prompt_BT.shape
    # Cast (and pad) the layer weights once, not on every decoded token.
    model = eqx.tree_at(lambda m: m.blocks, model, model.compute_blocks())
    cache = model.init_cache(B, T + max_new)
    logits_BV, cache = prefill(model, prompt_BT, lengths_B, cache)
    # made like the logits, so typed like them under shard_map (varying over the devices
    # whose rows or trials differ), as the loop's carry must stay
    out = jnp.full_like(logits_BV, pad_id, shape=(B, max_new), dtype=jnp.int32)
    done = jnp.zeros_like(logits_BV, shape=(B,), dtype=bool)
    # One token per step runs the layers one by one, each with its own cache buffer in the
    # loop carry, which XLA updates in place (a scan over the stacked cache would copy all of
    # it on every token: docs/design.md §2). The prompt goes through `extend`'s scan, once.
    layers = model.layer_list()
    caches = tuple((cache.k_LBSNH[i], cache.v_LBSNH[i]) for i in range(len(layers)))

    def cond(carry):
        i, _, _, _, done, _ = carry
        return (i < max_new) & ~eqxi.unvmap_all(jnp.all(done))

    def step(carry):
        i, logits_BV, caches, pos_B, done, out = carry
        if key is None:
            tok = jnp.argmax(logits_BV, axis=-1).astype(jnp.int32)
        else:
            tok = jax.random.categorical(jax.random.fold_in(key, i), logits_BV).astype(jnp.int32)
        out = out.at[:, i].set(jnp.where(done, pad_id, tok))
        done = done | (tok == eos_id)
        logits_BV, caches = model.next_token(tok, layers, caches, pos_B)
        return i + 1, logits_BV, caches, pos_B + 1, done, out

    carry = (jnp.int32(0), logits_BV, caches, cache.pos_B, done, out)
    return jax.lax.while_loop(cond, step, carry)[-1]
