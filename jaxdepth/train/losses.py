"""Token-level losses. Sums (not means) so gradient accumulation is exact: divide once at the end."""
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
