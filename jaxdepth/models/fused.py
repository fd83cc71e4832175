"""A backbone, a layer-fusion module and a task head: the model of the fusion tasks
(docs/design.md §4). The backbone is any ``Backbone`` (models/backbone.py).

``h`` is computed from the backbone's layer outputs ``z_LBTD`` by the method of ``fusion.method``,
a class of models/fusions/ (Base, Base+n, Concat, DWAtt, ...), which this model asks what it
adds and how it fuses, and whether it needs the whole sentence (``WHOLE_SEQUENCE``).

Heads: token classification (NER: dropout then a linear map over ``h``) or BERT's MLM head tied
to the backbone's word embeddings. The head only needs ``h`` where a label or a masked token
is, so ``positions_BP`` (first sub-tokens, masked slots) are gathered *before* DWAtt / Concat,
which then cost P rather than T positions per sequence; a whole-sequence method (Base+n: its layers attend
over the sentence) is gathered after. The result at the gathered positions is identical.

Modes: ``fe`` runs the backbone without dropout under ``stop_gradient`` and leaves it out of
``trainable_spec``, so the train step neither differentiates nor updates it; ``ft`` trains
everything. DWAtt's frozen layer keys never train in either mode. In ``fe`` the backbone's
contribution is a fixed function of the sentence (``frozen_states``), so a task can compute it
once and train the rest on it (``logits_from_states``; tasks/ner.py does).
"""
from __future__ import annotations

import equinox as eqx
import jax
import jax.numpy as jnp
from jaxtyping import Array

from ..config import may_drop, setting
from .backbone import Backbone
from .declared import Declared
from .encoder import BertEmbeddings
from .encoder_mlm import bert_mlm_head
from .fusion import fusion_trainable
from .fusions import FusionMethod, fusion_method
from .heads import MLMHead, gather_positions
from .layers import Dense, dropout, split_or_none


def make_fusion(method: str, backbone: Backbone, n_extra: int, *, key: Array):
    """The module fusion.method ``method`` adds on ``backbone`` (None for Base)."""
    return fusion_method(method).build(backbone, n_extra, key=key)


def fusion_param_count(method: str, backbone: Backbone, n_extra: int = 1) -> int:
    """Trainable parameters the fusion method adds on this backbone (Table 2; head excluded)."""
    return fusion_method(method).param_count(backbone, n_extra)


class FusedModel(Declared):
    backbone: Backbone
    fusion: eqx.Module | None
    head: Dense | MLMHead  # token classification, or BERT's MLM head
    method: str = eqx.field(static=True)
    mode: str = eqx.field(static=True)  # fe | ft
    rate: float = eqx.field(static=True)  # dropout on h before a classification head

    def __init__(self, backbone, *, method: str, mode: str, n_labels: int = 0, mlm: bool = False,
                 n_extra: int = 1, rate: float = 0.1, key: Array):
        kf, kh = jax.random.split(key)
        self.backbone = backbone
        self.fusion = make_fusion(method, backbone, n_extra, key=kf)
        if mlm:
            if not isinstance(getattr(backbone, "embed", None), BertEmbeddings):
                raise ValueError(f"MLM with fusion needs a BERT/RoBERTa backbone (its tied word "
                                 f"embeddings), not a {type(backbone).__name__}")
            self.head = bert_mlm_head(backbone.cfg, key=kh)
        else:
            self.head = Dense(backbone.width, n_labels, key=kh)
        self.method, self.mode, self.rate = method, mode, rate

    @property
    def kind(self) -> type[FusionMethod]:
        return fusion_method(self.method)

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
            return jax.lax.stop_gradient(self.backbone.layer_states(tokens_BT, segments_BT,
                                                                    mask_BT))
        return self.backbone.layer_states(tokens_BT, segments_BT, mask_BT, key=key)

    def frozen_states(self, tokens_BT: Array, segments_BT: Array | None, mask_BT: Array | None,
                      positions_BP: Array) -> Array:
        """What a frozen (fe) backbone gives the rest of the model, which never changes for a
        sentence, one row per sentence so it caches and batches like the other arrays: z at
        positions_BP ([B, L, P, D]), or Base+n's input z_L at every position ([B, T, D]).
        ``logits_from_states`` continues from here."""
        z_LBTD = self.layer_states(tokens_BT, segments_BT, mask_BT)
        if self.kind.WHOLE_SEQUENCE:
            return z_LBTD[-1]
        return jnp.moveaxis(gather_positions(z_LBTD, positions_BP[None]), 0, 1)

    def _fuse(self, z, mask_BT: Array | None, positions_BP: Array | None,
              key: Array | None) -> Array:
        """h from the backbone's states: z_L [B, T, D] for a whole-sequence method (gathered
        after), else z [L, B, P or T, D] already at the wanted positions."""
        if self.kind.WHOLE_SEQUENCE:
            rate = 0.0 if key is None else self.backbone.dropout_rate
            h_BTD = self.kind.fuse(self.fusion, z, mask_BT, rate, key)
            return h_BTD if positions_BP is None else gather_positions(h_BTD, positions_BP)
        return self.kind.fuse(self.fusion, z, mask_BT, 0.0, key)

    def features(self, tokens_BT: Array, segments_BT: Array | None, mask_BT: Array | None,
                 positions_BP: Array | None = None, *, key: Array | None = None) -> Array:
        """h at positions_BP ([B, P, D]), or at every position ([B, T, D]) when it is None."""
        k_bb, k_fu = split_or_none(key, 2)
        z_LBTD = self.layer_states(tokens_BT, segments_BT, mask_BT, key=k_bb)
        if self.kind.WHOLE_SEQUENCE:
            return self._fuse(z_LBTD[-1], mask_BT, positions_BP, k_fu)
        if positions_BP is not None:
            z_LBTD = gather_positions(z_LBTD, positions_BP[None])
        return self._fuse(z_LBTD, mask_BT, positions_BP, k_fu)

    def __call__(self, tokens_BT: Array, segments_BT: Array | None, mask_BT: Array | None,
                 positions_BP: Array | None = None, *, key: Array | None = None,
                 n_active: int = 0) -> Array:
        """Token-classification logits (float32) at positions_BP (or every position).
        n_active > 0 bounds the word slots in use (positions > 0) in the batch: a word-by-word
        method then runs at those only (_packed_logits), and the logits of the other slots
        are 0."""
        k_feat, k_drop = split_or_none(key, 2)
        if n_active and positions_BP is not None and not self.kind.WHOLE_SEQUENCE:
            k_bb, _ = split_or_none(k_feat, 2)
            z_LBTD = self.layer_states(tokens_BT, segments_BT, mask_BT, key=k_bb)
            z_LBPD = gather_positions(z_LBTD, positions_BP[None])
            L, B, P, D = z_LBPD.shape
            slots_K = jnp.nonzero((positions_BP > 0).reshape(-1), size=n_active,
                                  fill_value=B * P)[0]
            z_LKD = jnp.take(z_LBPD.reshape(L, B * P, D), slots_K, axis=1, mode="fill",
                             fill_value=0)
            return self._packed_logits(z_LKD, slots_K, B, P, k_drop)
        h = self.features(tokens_BT, segments_BT, mask_BT, positions_BP, key=k_feat)
        return self._classify(h, k_drop)

    def _packed_logits(self, z_LKD: Array, slots_K: Array, B: int, P: int,
                       key: Array | None) -> Array:
        """Logits [B, P, C] from the states of K word slots packed in slot order (slots_K:
        their flat index in [B, P]; B * P marks padding, whose states are zeros and whose
        logits are dropped), 0 at the slots not given. DWAtt and Concat act position by
        position, and a few-shot NER batch leaves most of its [B, P] slots empty. Dropout
        is drawn per slot (fold_in(key, slot)), so a slot's mask does not depend on where
        it was packed: the cached and uncached paths and any process layout agree."""
        logits_KC = self.word_logits(z_LKD, slots_K, key)
        out = jnp.zeros((B * P, logits_KC.shape[-1]), jnp.float32)
        return out.at[slots_K].set(logits_KC, mode="drop").reshape(B, P, -1)

    def word_logits(self, z_LKD: Array, slots_K: Array | None = None,
                    key: Array | None = None) -> Array:
        """Logits [K, C] (float32) of K words from their layer states [L, K, D] alone (a
        word-by-word method); dropout (with a key) needs each word's slot id."""
        h_KD = self.kind.fuse(self.fusion, z_LKD[:, None], None, 0.0, None)[0]
        rate = self.head_rate
        if key is not None and may_drop(rate):
            keys_K = jax.vmap(lambda s: jax.random.fold_in(key, s))(slots_K)
            h_KD = jax.vmap(lambda k, h: dropout(h, rate, k))(keys_K, h_KD)
        return self.head(h_KD).astype(jnp.float32)

    def logits_from_states(self, states, mask_BT: Array, positions_BP: Array, *,
                           key: Array | None = None) -> Array:
        """``__call__``'s logits from ``frozen_states`` (fe only), with the same dropout masks
        for the same key: the keys are split exactly as there."""
        if not self.frozen_backbone:
            raise ValueError("logits_from_states needs a frozen backbone (fusion.mode=fe)")
        k_feat, k_drop = split_or_none(key, 2)
        _, k_fu = split_or_none(k_feat, 2)
        z = states if self.kind.WHOLE_SEQUENCE else jnp.moveaxis(states, 1, 0)
        return self._classify(self._fuse(z, mask_BT, positions_BP, k_fu), k_drop)

    def logits_from_words(self, words_KLD: Array, slots_K: Array, positions_BP: Array, *,
                          key: Array | None = None) -> Array:
        """``__call__``'s logits with n_active (fe; a word-by-word method) from the frozen
        states of the words in use alone, packed as there ([K, L, D], slots_K their flat
        index in [B, P], B * P: padding): the same numbers and dropout masks, without a
        [B, L, P, D] block per batch."""
        if not self.frozen_backbone or self.kind.WHOLE_SEQUENCE:
            raise ValueError("logits_from_words needs a frozen backbone (fusion.mode=fe) and "
                             "a fusion that acts word by word")
        _, k_drop = split_or_none(key, 2)
        B, P = positions_BP.shape
        return self._packed_logits(jnp.moveaxis(words_KLD, 1, 0), slots_K, B, P, k_drop)

    @property
    def head_rate(self):
        """The dropout rate before the head (a trial's traced one inside a trial step)."""
        return setting("fusion.dropout", self.rate)

    def _classify(self, h: Array, key: Array | None) -> Array:
        return self.head(dropout(h, self.head_rate, key)).astype(jnp.float32)

    def masked_logits(self, tokens_BT: Array, segments_BT: Array | None, mask_BT: Array | None,
                      positions_BP: Array, *, key: Array | None = None) -> Array:
        """MLM logits [B, P, V] (float32) at the masked positions."""
        h = self.features(tokens_BT, segments_BT, mask_BT, positions_BP, key=key)
        return self.head(h, self.backbone.embed.word_VD)
