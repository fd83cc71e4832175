"""The ACT/ALBERT/BERT encoder sizes (``ACTConfig.preset``, the ``act-*`` presets of
presets.py)."""
from __future__ import annotations

# (tau, M) are the paper's; sizes are small enough for a CPU except base (ALBERT-base width).
ACT_PRESETS: dict[str, dict] = {
    "tiny": dict(tau=1e-3, max_iters=6, d_model=128, n_heads=2),
    "small": dict(tau=5e-4, max_iters=12, d_model=256, n_heads=4),
    "base": dict(tau=2.5e-4, max_iters=24, d_model=768, n_heads=12),
}

