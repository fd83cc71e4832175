"""Token-level losses. Sums (not means) so gradient accumulation is exact: divide once at the
end."""
from __future__ import annotations

import jax
import jax.numpy as jnp
from jaxtyping import Array


def token_nll(logits_BTV: Array, targets_BT: Array) -> tuple[Array, Array]:
    """Per-token negative log-likelihood and log-partition, both float32 [B, T]."""
    logits_BTV = logits_BTV.astype(jnp.float32)
    logz_BT = jax.nn.logsumexp(logits_BTV, axis=-1)
    gold_BT = jnp.take_along_axis(logits_BTV, targets_BT[..., None], axis=-1)[..., 0]
    return logz_BT - gold_BT, logz_BT


def lm_loss_sums(logits_BTV: Array, targets_BT: Array, weights_BT: Array,
                 z_loss: float = 0.0) -> tuple[Array, Array, Array]:
    """(objective sum, NLL sum, weight sum). objective = NLL + z_loss * log(Z)^2 (PaLM's z-loss)."""
    nll_BT, logz_BT = token_nll(logits_BTV, targets_BT)
    nll = jnp.sum(nll_BT * weights_BT)
    objective = nll + z_loss * jnp.sum(logz_BT * logz_BT * weights_BT) if z_loss else nll
    return objective, nll, jnp.sum(weights_BT)


def _chunk_terms(x_CD, w_DV, t_C, wt_C, with_z: bool):
    """(NLL sum, sum of w logz^2, [d nll / d logits, d z-term / d logits if with_z]) of one
    chunk of tokens."""
    logits = jnp.dot(x_CD, w_DV, preferred_element_type=jnp.float32)
    logz = jax.nn.logsumexp(logits, axis=-1)
    probs = jnp.exp(logits - logz[:, None])
    gold = jnp.take_along_axis(logits, t_C[:, None], axis=-1)[:, 0]
    nll = jnp.sum((logz - gold) * wt_C)
    onehot = jax.nn.one_hot(t_C, w_DV.shape[1], dtype=jnp.float32)
    d_nll = (probs - onehot) * wt_C[:, None]  # d nll / d logits
    grads = [d_nll]
    z = jnp.sum(logz * logz * wt_C)
    if with_z:
        grads.append(probs * (2.0 * logz * wt_C)[:, None])  # d sum(w logz^2) / d logits
    return nll, z, grads


def _chunked_forward(x_ND, w_DV, targets_N, weights_N, chunk: int, with_z: bool):
    """(NLL sum, z sum, input gradients, weight gradients) over chunks of `chunk` tokens."""
    d = x_ND.shape[1]
    xs = (x_ND.reshape(-1, chunk, d), targets_N.reshape(-1, chunk), weights_N.reshape(-1, chunk))

    def body(carry, inp):
        nll_acc, z_acc, dw_acc = carry
        x_CD, t_C, wt_C = inp
        nll, z, grads = _chunk_terms(x_CD, w_DV, t_C, wt_C, with_z)
        dx = [jnp.dot(g.astype(w_DV.dtype), w_DV.T, preferred_element_type=jnp.float32)
              for g in grads]
        dw = [acc + jnp.dot(x_CD.T, g.astype(x_CD.dtype), preferred_element_type=jnp.float32)
              for acc, g in zip(dw_acc, grads)]
        return (nll_acc + nll, z_acc + z, dw), dx

    zeros = [jnp.zeros(w_DV.shape, jnp.float32) for _ in range(2 if with_z else 1)]
    (nll, z, dw), dx = jax.lax.scan(body, (jnp.float32(0), jnp.float32(0), zeros), xs)
    dx = [g.reshape(-1, d) for g in dx]
    return nll, z, dx, dw


def fused_lm_head_loss(x_ND: Array, w_DV: Array, targets_N: Array, weights_N: Array,
                       z_loss: float = 0.0, chunk: int = 2048) -> tuple[Array, Array]:
    """(objective sum, NLL sum) of softmax(x @ w), computed over chunks of tokens.

    Equal to ``lm_loss_sums(x @ w, ...)[:2]`` but never materialises the [N, V] float32 logits:
    each chunk's logits are formed, reduced to the loss and turned into that chunk's input
    gradient and its share of the weight gradient in the same pass (custom_vjp), so the
    backward pass only scales them by the incoming cotangents. Gradients are exact for both
    outputs, z-loss included.
    """
    n, d = x_ND.shape
    chunk = min(chunk, n)
    pad = (-n) % chunk
    if pad:
        x_ND = jnp.concatenate([x_ND, jnp.zeros((pad, d), x_ND.dtype)])
        targets_N = jnp.concatenate([targets_N, jnp.zeros((pad,), targets_N.dtype)])
        weights_N = jnp.concatenate([weights_N, jnp.zeros((pad,), weights_N.dtype)])
    with_z = z_loss > 0.0
    x_dtype, w_dtype = x_ND.dtype, w_DV.dtype

    def forward(*args):
        return _chunked_forward(*args, chunk, with_z)

    @jax.custom_vjp
    def loss(x_ND, w_DV, targets_N, weights_N):
        nll, z, _, _ = forward(x_ND, w_DV, targets_N, weights_N)
        return nll + z_loss * z, nll

    def loss_fwd(x_ND, w_DV, targets_N, weights_N):
        nll, z, dx, dw = forward(x_ND, w_DV, targets_N, weights_N)
        return (nll + z_loss * z, nll), (dx, dw)

    def loss_bwd(res, cot):
        (dx, dw), (g_obj, g_nll) = res, cot
        g_x = (g_obj + g_nll) * dx[0]
        g_w = (g_obj + g_nll) * dw[0]
        if with_z:
            g_x = g_x + (g_obj * z_loss) * dx[1]
            g_w = g_w + (g_obj * z_loss) * dw[1]
        # no gradient for the targets or the weights
        return g_x.astype(x_dtype), g_w.astype(w_dtype), None, None

    loss.defvjp(loss_fwd, loss_bwd)
    return loss(x_ND, w_DV, targets_N, weights_N)


def softmax_xent(logits_BXC: Array, labels_BX: Array) -> Array:
    """Per-position cross-entropy of integer labels, float32 (classification and MLM heads):
    bfloat16 logits are upcast first, as token_nll does, so a bf16 loss keeps its precision
    (float32 logits are unchanged)."""
    logits_BXC = logits_BXC.astype(jnp.float32)
    logz = jax.nn.logsumexp(logits_BXC, axis=-1)
    gold = jnp.take_along_axis(logits_BXC, labels_BX[..., None].astype(jnp.int32), axis=-1)[..., 0]
    return logz - gold


def weighted_xent_sum(logits_BXC: Array, labels_BX: Array, weights_BX: Array) -> Array:
    """softmax_xent summed with a weight per position (MLM: 0 on unused prediction slots)."""
    return jnp.sum(weights_BX.astype(jnp.float32) * softmax_xent(logits_BXC, labels_BX))


def labelled_xent_sum(logits_BXC: Array, labels_BX: Array) -> Array:
    """softmax_xent summed over the positions that have a label (label -1: none)."""
    valid = (labels_BX >= 0).astype(jnp.float32)
    return jnp.sum(valid * softmax_xent(logits_BXC, jnp.maximum(labels_BX, 0)))


# What a micro-batch's sums are divided by, counted once on the whole batch (at least 1).
_TOTALS = {
    "predictions": lambda b: jnp.maximum(jnp.sum(b["mlm_weights"].astype(jnp.float32)), 1.0),
    "rows": lambda b: jnp.float32(b["tokens"].shape[0]),
    "labels": lambda b: jnp.maximum(jnp.sum((b["labels"] >= 0).astype(jnp.float32)), 1.0),
    "tokens": lambda b: jnp.maximum(jnp.sum(b["mask"].astype(jnp.float32)), 1.0),
}


def batch_totals(*names: str):
    """An objective's ``totals(batch)``: the named counts of _TOTALS."""
    return lambda batch: {n: _TOTALS[n](batch) for n in names}
