"""The paper's Table 2: parameters each fusion method adds on a backbone (the command is
``python -m jaxdepth.experiments.table2``).

Counts come from the built modules (``FusionMethod.param_count``, models/fusions/), as a share
of the backbone's own parameters; Base adds none (the head is common to every method and left
out).
"""
from __future__ import annotations

import jax


def param_table(backbone, n_extra: int = 1) -> list[dict]:
    from ..models.fusions import fusion_method, fusion_methods
    total = sum(int(x.size) for x in jax.tree.leaves(backbone) if hasattr(x, "shape"))
    rows = []
    for m in map(fusion_method, fusion_methods()):
        added = m.param_count(backbone, n_extra)
        rows.append({"method": m.label(n_extra), "added": added, "share": added / total,
                     "backbone": total})
    return rows


def markdown(rows: list[dict]) -> str:
    lines = [f"Parameters added on a backbone of {rows[0]['backbone']:,}", "",
             "| method | added | % of backbone |", "|---|---:|---:|"]
    lines += [f"| {r['method']} | {r['added']:,} | {100 * r['share']:.2f} |" for r in rows]
    return "\n".join(lines) + "\n"
