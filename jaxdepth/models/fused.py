"""A backbone (models/backbone.py), a layer-fusion module and a task head: the model of the
fusion tasks (docs/design.md §4).

``h`` comes from the backbone's layer outputs ``z_LBTD`` through the module of
``fusion.method`` (models/fusions/); what the method reads (its ``INPUT``: each word's states,
or the whole sentence) decides, through ``reads``, what is taken of ``z_LBTD``, where h is
gathered and how a frozen backbone's states form one row per sentence. The head (NER's dropout
and linear map, or BERT's MLM head tied to the word embeddings) needs ``h`` only at
``positions_BP``, so a method that reads words gets ``z`` gathered there before fusing (P rather
than T positions per sequence; the same result), and one that reads the sentence after.

Modes: ``fe`` runs the backbone without dropout under ``stop_gradient`` and leaves it out of
``trainable_spec``; ``ft`` trains everything. DWAtt's frozen layer keys never train. In ``fe`` the
backbone's contribution is a fixed function of the sentence (``frozen_states``), which a task
can compute once and train the rest on (``logits_from_states``; tasks/ner.py does).
"""
from __future__ import annotations

import equinox as eqx
import jax
import jax.numpy as jnp
from jaxtyping import Array

from .trial_tracing import may_drop, setting
from .backbone import Backbone
from .declared import Declared
from .encoder import BertEmbeddings, bert_mlm_head
from .flops import module_flops, module_flops_per_token
from .fusions import FusionMethod, fusion_method, fusion_trainable
from .layers import Dense, MLMHead, dropout, split_or_none


class FusedModel(Declared):
    backbone: Backbone
    fusion: FusionMethod  # fusion.method's module (its class carries the name)
    head: Dense | MLMHead  # token classification, or BERT's MLM head
    # fusion.mode fe: the backbone runs without dropout under stop_gradient, gets no optimizer
    # moments and can be cached | ft: it trains with the rest
    frozen_backbone: bool = eqx.field(static=True)
    rate: float = eqx.field(static=True)  # dropout on h before a classification head

    def __init__(self, backbone, *, method: str, frozen_backbone: bool, n_labels: int = 0,
                 mlm: bool = False, n_extra: int = 1, rate: float = 0.1, key: Array):
        kf, kh = jax.random.split(key)
        self.backbone = backbone
        self.fusion = fusion_method(method).build(backbone, n_extra, key=kf)
        if mlm:
            if not isinstance(getattr(backbone, "embed", None), BertEmbeddings):
                raise ValueError(f"MLM with fusion needs a BERT/RoBERTa backbone (its tied word "
                                 f"embeddings), not a {type(backbone).__name__}")
            self.head = bert_mlm_head(backbone.cfg, key=kh)
        else:
            self.head = Dense(backbone.width, n_labels, key=kh)
        self.frozen_backbone, self.rate = frozen_backbone, rate

    # the head's dropout, and a fine-tuned backbone's own
    uses_dropout = True

    def flops_per_token(self, seq_len: int, cached_backbone: bool = False) -> int:
        """cached_backbone: a step reads the frozen backbone's cached states (tasks/ner.py) and
        never runs it: the fusion module and head only (and Base+n's attention)."""
        if not cached_backbone:
            return module_flops(self, seq_len)
        spec = self.trainable_spec()
        return module_flops_per_token((self.fusion, self.head), (spec.fusion, spec.head),
                                      seq_len, self.fusion.attention_layers, self.backbone.width)

    @property
    def method(self) -> str:
        """fusion.method"""
        return self.fusion.NAME

    @property
    def reads(self):
        """What the fusion method reads of the backbone (models/fusions/: Words or Sentence)."""
        return type(self.fusion).INPUT

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

    def _taken(self, tokens_BT, segments_BT, mask_BT, positions_BP, key) -> Array:
        """What the fusion method reads of the backbone's output (at positions_BP or all)."""
        return self.reads.take(self.layer_states(tokens_BT, segments_BT, mask_BT, key=key),
                               positions_BP)

    def frozen_states(self, tokens_BT: Array, segments_BT: Array | None, mask_BT: Array | None,
                      positions_BP: Array) -> Array:
        """What a frozen (fe) backbone gives the rest of the model, which never changes for a
        sentence, one row per sentence so it caches and batches like the other arrays: z at
        positions_BP ([B, L, P, D]) for a method that reads words, z_L at every position
        ([B, T, D]) for one that reads the sentence. ``logits_from_states`` continues from
        here."""
        return self.reads.rows(self._taken(tokens_BT, segments_BT, mask_BT, positions_BP, None))

    def _h(self, z, mask_BT: Array | None, positions_BP: Array | None,
           key: Array | None) -> Array:
        """h at positions_BP (or every position) from what the method reads; a method that
        adds layers trains them with the backbone's dropout rate."""
        rate = 0.0 if key is None else self.backbone.dropout_rate
        return self.reads.h(self.fusion, z, mask_BT, positions_BP, rate, key)

    def features(self, tokens_BT: Array, segments_BT: Array | None, mask_BT: Array | None,
                 positions_BP: Array | None = None, *, key: Array | None = None) -> Array:
        """h at positions_BP ([B, P, D]), or at every position ([B, T, D]) when it is None."""
        k_bb, k_fu = split_or_none(key, 2)
        z = self._taken(tokens_BT, segments_BT, mask_BT, positions_BP, k_bb)
        return self._h(z, mask_BT, positions_BP, k_fu)

    def __call__(self, tokens_BT: Array, segments_BT: Array | None, mask_BT: Array | None,
                 positions_BP: Array | None = None, *, key: Array | None = None,
                 n_active: int = 0) -> Array:
        """Token-classification logits (float32) at positions_BP (or every position).
        n_active > 0 bounds the word slots in use (positions > 0) in the batch: a method
        that reads words then runs at those only (_packed_logits), and the logits of the
        other slots are 0."""
        k_feat, k_drop = split_or_none(key, 2)
        k_bb, k_fu = split_or_none(k_feat, 2)
        z = self._taken(tokens_BT, segments_BT, mask_BT, positions_BP, k_bb)
        if n_active and positions_BP is not None and self.reads.PER_WORD:
            L, B, P, D = z.shape
            slots_K = jnp.nonzero((positions_BP > 0).reshape(-1), size=n_active,
                                  fill_value=B * P)[0]
            z_LKD = jnp.take(z.reshape(L, B * P, D), slots_K, axis=1, mode="fill",
                             fill_value=0)
            return self._packed_logits(z_LKD, slots_K, B, P, k_drop)
        return self._classify(self._h(z, mask_BT, positions_BP, k_fu), k_drop)

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
        method that reads words); dropout (with a key) needs each word's slot id."""
        h_KD = self.reads.h(self.fusion, z_LKD[:, None], None, None, 0.0, None)[0]
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
        z = self.reads.from_rows(states)
        return self._classify(self._h(z, mask_BT, positions_BP, k_fu), k_drop)

    def logits_from_words(self, words_KLD: Array, slots_K: Array, positions_BP: Array, *,
                          key: Array | None = None) -> Array:
        """``__call__``'s logits with n_active (fe; a method that reads words) from the frozen
        states of the words in use alone, packed as there ([K, L, D], slots_K their flat
        index in [B, P], B * P: padding): the same numbers and dropout masks, without a
        [B, L, P, D] block per batch."""
        if not self.frozen_backbone:
            raise ValueError("logits_from_words needs a frozen backbone (fusion.mode=fe)")
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
