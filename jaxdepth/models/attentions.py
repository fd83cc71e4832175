"""The decoder's attention for training and evaluation (``model.attention``, docs/design.md
§2.1), one class each: this project's einsum ``attend`` (the reference), or
``jax.nn.dot_product_attention`` on XLA's path or forced onto cuDNN's fused flash kernel.

A class says what models/layers.py:Attention asks of it: whether it goes through
``jax.nn.dot_product_attention`` (``JAX``), with which ``implementation``, in which dtype that
kernel takes the position bias, and which configs it cannot run (``check``). Nothing outside
this module compares an attention's name. It imports nothing of jaxdepth but errors.py and
choices.py, so that config.py can validate against it (and hand it on to the models, which
import only config).
"""
from __future__ import annotations

from typing import ClassVar

from ..choices import Choices, Registered
from ..errors import ConfigError


_ATTENTIONS: Choices[type["AttentionPath"]] = Choices("attention", "model.attention",
                                                      order=lambda cls: cls.ORDER)


class AttentionPath(Registered):
    NAME: ClassVar[str]  # the value of model.attention
    ORDER: ClassVar[int]
    JAX: ClassVar[bool] = True  # through jax.nn.dot_product_attention (else our einsum attend)
    IMPLEMENTATION: ClassVar[str | None] = None  # its ``implementation`` argument
    # The bias in the inputs' dtype (cuDNN's kernel), else added to float32 logits (XLA's path
    # and ours).
    BIAS_IN_INPUT_DTYPE: ClassVar[bool] = False

    REGISTRY = _ATTENTIONS

    @classmethod
    def check(cls, model) -> None:
        """Refuse (ConfigError naming the field) a model this path cannot run."""


class Einsum(AttentionPath):
    NAME, ORDER, JAX = "einsum", 0, False


class DotProduct(AttentionPath):
    """implementation=None: XLA's path in jax 0.10, float32 logits and softmax as ours."""
    NAME, ORDER = "dot_product", 1


class CuDNN(AttentionPath):
    """cuDNN's fused flash kernel: GPU only; skips the masked half under is_causal and never
    stores the [T, T] probabilities."""
    NAME, ORDER, IMPLEMENTATION, BIAS_IN_INPUT_DTYPE = "cudnn", 2, "cudnn", True

    @classmethod
    def check(cls, model):
        if model.compute_dtype != "bfloat16":
            raise ConfigError("model.attention: cudnn's fused kernel takes bf16/fp16 inputs "
                              "only: set model.compute_dtype bfloat16 (or use dot_product)",
                              field="model.attention")


# attention_path(name): the attention called ``name`` (a ConfigError naming model.attention
# for any other)
attention_path, attention_names = _ATTENTIONS, _ATTENTIONS.names
