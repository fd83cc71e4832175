"""Run-time options of a built model: same weights, another static config."""
from __future__ import annotations

import copy
import dataclasses


def with_options(module, shape_fields: tuple[str, ...], **changes):
    """A copy of ``module`` whose static ``cfg`` has ``changes`` applied, sharing its weights.

    Only options that leave parameter shapes alone (remat, dtype, dropout, scan layout...) may
    change; touching one of ``shape_fields`` is an error, since the weights would not fit.
    """
    cfg = dataclasses.replace(module.cfg, **changes)
    changed = [f for f in shape_fields if getattr(cfg, f) != getattr(module.cfg, f)]
    if changed:
        raise ValueError(f"with_options cannot change parameter shapes ({', '.join(changed)})")
    out = copy.copy(module)
    object.__setattr__(out, "cfg", cfg)  # cfg is a static field of a frozen eqx.Module
    return out
