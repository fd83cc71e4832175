"""A backbone, a layer-fusion module and a task head: the model of the fusion tasks (DESIGN §4).

``h`` is computed from the backbone's layer outputs ``z_LBTD`` by the method of ``fusion.method``:

- ``base``: ``h = z_L`` (only the head is added);
- ``base+n``: ``n`` freshly initialised transformer layers run on ``z_L``;
- ``concat`` / ``dwatt``: the modules of models/fusion.py over all L outputs.

Heads: token classification (NER: dropout then a linear map over ``h``) or BERT's MLM head tied
to the backbone's word embeddings. The head only needs ``h`` where a label or a masked token
is, so ``positions_BP`` (first sub-tokens, masked slots) are gathered *before* DWAtt / Concat,
which then cost P rather than T positions per sequence; Base+n's layers attend over the whole
sequence and are gathered after. The result at the gathered positions is identical.

Modes: ``fe`` runs the backbone without dropout under ``stop_gradient`` and leaves it out of
``trainable_spec``, so the train step neither differentiates nor updates it; ``ft`` trains
everything. DWAtt's frozen layer keys never train in either mode.
"""
from __future__ import annotations

import equinox as eqx
import jax
import jax.numpy as jnp
from jaxtyping import Array

from ..layers import Dense, dropout, split_or_none
from .backbone import backbone_heads, depth_and_width, layer_states
from .encoder import BertLayer, Encoder
from .encoder_mlm import BertMLMHead, gather_positions
from .fusion import Concat, DWAtt, added_params, fusion_trainable


class ExtraLayers(eqx.Module):
    """Base+n: n fresh post-LN BERT layers (stacked, scanned) on top of the backbone."""

    layers: BertLayer  # every leaf has a leading axis n
    n: int = eqx.field(static=True)

    def __init__(self, n: int, d_model: int, n_heads: int, d_ff: int, *, eps: float = 1e-12,
                 activation: str = "gelu", key: Array):
        make = lambda k: BertLayer(d_model, n_heads, d_ff, eps=eps,  # noqa: E731
                                   activation=activation, key=k)
        self.layers = eqx.filter_vmap(make)(jax.random.split(key, n))
        self.n = n

    def __call__(self, x_BTD: Array, mask_BT: Array, rate: float = 0.0,
                 key: Array | None = None) -> Array:
        params, static = eqx.partition(self.layers, eqx.is_array)

        def body(h, xs):
            p, i = xs
            k = None if key is None else jax.random.fold_in(key, i)
            return eqx.combine(p, static)(h, mask_BT, rate, k), None

        h, _ = jax.lax.scan(body, x_BTD, (params, jnp.arange(self.n, dtype=jnp.int32)))
        return h


def make_fusion(method: str, backbone, n_extra: int, *, key: Array):
    L, d = depth_and_width(backbone)
    if method == "base":
        return None
    if method == "dwatt":
        return DWAtt(L, d, key=key)
    if method == "concat":
        return Concat(L, d, key=key)
    if method == "base+n":
        c = backbone.cfg
        eps = c.layer_norm_eps if isinstance(backbone, Encoder) else 1e-12
        act = c.activation if isinstance(backbone, Encoder) else "gelu"
        d_ff = getattr(c, "d_ff", 0) or 4 * d
        return ExtraLayers(n_extra, d, backbone_heads(backbone), d_ff, eps=eps, activation=act,
                           key=key)
    raise ValueError(f"unknown fusion method {method!r}")


def fusion_param_count(method: str, backbone, n_extra: int = 1) -> int:
    """Trainable parameters the fusion method adds on this backbone (Table 2; head excluded)."""
    L, d = depth_and_width(backbone)
    if method in ("dwatt", "concat"):
        return added_params(method, L, d)
    if method == "base":
        return 0
    abstract = eqx.filter_eval_shape(make_fusion, method, backbone, n_extra, key=jax.random.key(0))
    return sum(int(x.size) for x in jax.tree.leaves(abstract))


class FusedModel(eqx.Module):
    backbone: eqx.Module
    fusion: eqx.Module | None
    head: eqx.Module  # Dense (token classification) or BertMLMHead
    method: str = eqx.field(static=True)
    mode: str = eqx.field(static=True)  # fe | ft
    rate: float = eqx.field(static=True)  # dropout on h before a classification head

    def __init__(self, backbone, *, method: str, mode: str, n_labels: int = 0, mlm: bool = False,
                 n_extra: int = 1, rate: float = 0.1, key: Array):
        kf, kh = jax.random.split(key)
        _, d = depth_and_width(backbone)
        self.backbone = backbone
        self.fusion = make_fusion(method, backbone, n_extra, key=kf)
        if mlm:
            if not isinstance(backbone, Encoder):
                raise ValueError(f"MLM with fusion needs a BERT/RoBERTa backbone (its tied word "
                                 f"embeddings), not a {type(backbone).__name__}")
            c = backbone.cfg
            self.head = BertMLMHead(d, c.vocab_size, eps=c.layer_norm_eps,
                                    activation=c.activation, key=kh)
        else:
            self.head = Dense(d, n_labels, key=kh)
        self.method, self.mode, self.rate = method, mode, rate

    @property
    def frozen_backbone(self) -> bool:
        return self.mode == "fe"

    def trainable_spec(self):
        """Filter spec for the optimiser: the fusion module and head (+ the backbone in FT)."""
        spec = fusion_trainable(self)
        if self.frozen_backbone:
            spec = eqx.tree_at(lambda m: m.backbone, spec,
                               jax.tree.map(lambda _: False, spec.backbone))
        return spec

    def layer_states(self, tokens_BT, segments_BT, mask_BT, *, key=None) -> Array:
        if self.frozen_backbone:  # a fixed feature extractor: no dropout, no gradient
            return jax.lax.stop_gradient(layer_states(self.backbone, tokens_BT, segments_BT,
                                                      mask_BT))
        return layer_states(self.backbone, tokens_BT, segments_BT, mask_BT, key=key)

    def features(self, tokens_BT: Array, segments_BT: Array | None, mask_BT: Array | None,
                 positions_BP: Array | None = None, *, key: Array | None = None) -> Array:
        """h at positions_BP ([B, P, D]), or at every position ([B, T, D]) when it is None."""
        k_bb, k_fu = split_or_none(key, 2)
        z_LBTD = self.layer_states(tokens_BT, segments_BT, mask_BT, key=k_bb)
        if self.method == "base+n":
            mask = jnp.ones(tokens_BT.shape, bool) if mask_BT is None else mask_BT.astype(bool)
            rate = 0.0 if k_fu is None else self._backbone_rate()
            h_BTD = self.fusion(z_LBTD[-1], mask, rate, k_fu)
            return h_BTD if positions_BP is None else gather_positions(h_BTD, positions_BP)
        if positions_BP is not None:
            z_LBTD = gather_positions(z_LBTD, positions_BP[None])
        return z_LBTD[-1] if self.fusion is None else self.fusion(z_LBTD)

    def _backbone_rate(self) -> float:
        return float(getattr(self.backbone.cfg, "dropout", 0.0))

    def __call__(self, tokens_BT: Array, segments_BT: Array | None, mask_BT: Array | None,
                 positions_BP: Array | None = None, *, key: Array | None = None) -> Array:
        """Token-classification logits (float32) at positions_BP (or every position)."""
        k_feat, k_drop = split_or_none(key, 2)
        h = self.features(tokens_BT, segments_BT, mask_BT, positions_BP, key=k_feat)
        return self.head(dropout(h, self.rate, k_drop)).astype(jnp.float32)

    def masked_logits(self, tokens_BT: Array, segments_BT: Array | None, mask_BT: Array | None,
                      positions_BP: Array, *, key: Array | None = None) -> Array:
        """MLM logits [B, P, V] (float32) at the masked positions."""
        h = self.features(tokens_BT, segments_BT, mask_BT, positions_BP, key=key)
        return self.head(h, self.backbone.word_VD)
