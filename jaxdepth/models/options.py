"""Run-time options of a built model: same weights, another static config."""
from __future__ import annotations

import copy
import dataclasses


def with_options(module, extra_shape_fields: tuple[str, ...] = (), **changes):
    """A copy of ``module`` whose static ``cfg`` has ``changes`` applied, sharing its weights.

    Only options that leave parameter shapes alone (remat, dtype, dropout, scan layout...) may
    change; touching a field of ``cfg.shape()`` (or of ``extra_shape_fields``, fields that fix
    shapes in this model only) is an error, since the weights would not fit.
    """
    cfg = dataclasses.replace(module.cfg, **changes)

    def shape(c) -> dict:
        return {**c.shape(), **{f: getattr(c, f) for f in extra_shape_fields}}

    before, after = shape(module.cfg), shape(cfg)
    changed = [f for f in before if after[f] != before[f]]
    if changed:
        raise ValueError(f"with_options cannot change parameter shapes ({', '.join(changed)})")
    out = copy.copy(module)
    object.__setattr__(out, "cfg", cfg)  # cfg is a static field of a frozen eqx.Module
    return out
