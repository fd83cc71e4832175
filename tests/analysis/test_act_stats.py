"""ACT statistics (Table 1, Table 3, Fig. 2) against hand computations, and on a tiny model."""
import dataclasses
import json
import math

import equinox as eqx
import numpy as np
import pytest

from jaxdepth.analysis.act_stats import (GROUPS, CosineStats, IterationStats, evaluate_act,
                                         format_table1, plot_cosine, token_groups,
                                         write_cosine_table, write_table1)
from jaxdepth.data.corpus.tokenizer import CLS_ID, SEP_ID
from jaxdepth.models.act import ACTConfig, ACTEncoder, UntiedEncoder

C, S = CLS_ID, SEP_ID


def consecutive_cosine(states_MBTD, h0_BTD, mask, groups,
                       iterations_run, N_BT=None):
    """Mean cosine similarity between h[n] and h[n + 1] for one batch (see `CosineStats`):
    n = 0 .. M - 1 when h0_BTD is given (n = 0 is the pair (h0, h1)), else n = 1 .. M - 1.
    Steps with n + 1 > iterations_run (constant repeats) are NaN. With N_BT, "running" /
    "halted" split the tokens by whether they were updated at iteration n + 1."""
    acc = CosineStats(np.shape(states_MBTD)[0], list(groups), include_h0=h0_BTD is not None)
    acc.add(states_MBTD, h0_BTD, mask, groups, iterations_run, N_BT)
    return acc.result()


def hand_batch():
    """Row 0: [CLS] 10 [MASK] [SEP] pad; row 1: [CLS] 11(random) 12(kept) 13 [SEP];
    row 2: all padding (a filler row)."""
    return {
        "tokens": np.array([[C, 10, 5, S, 0], [C, 11, 12, 13, S], [0] * 5], np.int32),
        "segments": np.zeros((3, 5), np.int32),
        "mask": np.array([[1, 1, 1, 1, 0], [1, 1, 1, 1, 1], [0] * 5], np.int32),
        "mask_kind": np.array([[0, 0, 1, 0, 0], [0, 2, 3, 0, 0], [0] * 5], np.int32),
        "mlm_positions": np.array([[2, 0], [1, 2], [0, 0]], np.int32),
        "mlm_ids": np.array([[7, 0], [5, 6], [0, 0]], np.int32),
        "mlm_weights": np.array([[1, 0], [1, 1], [0, 0]], np.float32),
        "sop_labels": np.array([1, 0, 0], np.int32),
        "roles": np.array([[-1, 0, 1, -1, 1], [-1, 0, 0, 1, -1], [0] * 5], np.int32),
    }


def test_token_groups_hand_batch():
    g = token_groups(hand_batch())
    assert list(g) == list(GROUPS)
    T, F = True, False
    expect = {
        "all": [[T, T, T, T, F], [T, T, T, T, T], [F] * 5],
        "unmasked": [[F, T, F, F, F], [F, F, F, T, F], [F] * 5],
        "[MASK/MASK]": [[F, F, T, F, F], [F] * 5, [F] * 5],
        "[MASK/random]": [[F] * 5, [F, T, F, F, F], [F] * 5],
        "[MASK/original]": [[F] * 5, [F, F, T, F, F], [F] * 5],
        "[CLS]": [[T, F, F, F, F], [T, F, F, F, F], [F] * 5],
        "[SEP]": [[F, F, F, T, F], [F, F, F, F, T], [F] * 5],
    }
    for name, e in expect.items():
        assert g[name].dtype == bool
        np.testing.assert_array_equal(g[name], np.array(e), err_msg=name)


def hand_outputs():
    # Padding gets absurd values: it must never count.
    N = np.array([[1, 2, 3, 4, 99], [2, 3, 4, 5, 6], [99] * 5], np.float32)
    R = np.array([[.5, .25, 0, .1, 99], [0, .5, .5, 0, .2], [99] * 5], np.float32)
    V = 8
    mlm = np.zeros((3, 2, V), np.float32)
    mlm[0, 0, 7] = 1  # right (id 7)
    mlm[0, 1, 3] = 1  # unused slot (weight 0), would be wrong
    mlm[1, 0, 5] = 1  # right (id 5)
    mlm[1, 1, 1] = 1  # wrong (id 6)
    mlm[2, :, 4] = 1  # padding row, unused slots
    sop = np.array([[0, 1], [0, 1], [0, 1]], np.float32)  # labels 1, 0, (0: filler row)
    return N, R, mlm, sop


def test_iteration_stats_by_hand():
    b = hand_batch()
    N, R, mlm, sop = hand_outputs()
    st = IterationStats(role_names=["noun", "verb", "never"])
    st.add(b, N, R, mlm_logits=mlm, sop_logits=sop)
    t = st.table1()
    it = t["iterations"]
    assert it["all"] == pytest.approx((1 + 2 + 3 + 4 + 2 + 3 + 4 + 5 + 6) / 9)
    assert it["unmasked"] == pytest.approx((2 + 5) / 2)
    assert it["[MASK/MASK]"] == pytest.approx(3)
    assert it["[MASK/random]"] == pytest.approx(3)
    assert it["[MASK/original]"] == pytest.approx(4)
    assert it["[CLS]"] == pytest.approx((1 + 2) / 2)
    assert it["[SEP]"] == pytest.approx((4 + 6) / 2)
    assert t["ponder"]["all"] == pytest.approx((1.5 + 2.25 + 3 + 4.1 + 2 + 3.5 + 4.5 + 5 + 6.2) / 9)
    assert t["ponder"]["[SEP]"] == pytest.approx((4.1 + 6.2) / 2)
    assert t["tokens"] == {"all": 9, "unmasked": 2, "[MASK/MASK]": 1, "[MASK/random]": 1,
                           "[MASK/original]": 1, "[CLS]": 2, "[SEP]": 2}
    assert t["iterations_std"]["[CLS]"] == pytest.approx(0.5)
    assert t["histogram"]["all"] == {"1": 1, "2": 2, "3": 2, "4": 2, "5": 1, "6": 1}
    assert t["histogram"]["[CLS]"] == {"1": 1, "2": 1}
    assert t["histogram"]["[SEP]"] == {"4": 1, "6": 1}
    assert "Tokens by number of iterations (all 9): N=1: 11.1%, N=2: 22.2%" in format_table1(st)
    assert t["mlm_accuracy"] == pytest.approx(2 / 3) and t["mlm_predictions"] == 3
    assert t["sop_accuracy"] == pytest.approx(1 / 2) and t["sop_rows"] == 2
    roles = st.roles()
    assert list(roles) == ["noun", "verb", "never"]
    # noun: (0,1)=2, (1,1)=3, (1,2)=4; verb: (0,2)=3, (1,3)=5 (the padding (0,4) is ignored)
    assert roles["noun"]["iterations"] == pytest.approx(3) and roles["noun"]["count"] == 3
    assert roles["verb"]["iterations"] == pytest.approx(4) and roles["verb"]["count"] == 2
    assert roles["never"] == {"iterations": None, "ponder": None, "count": 0}

    # A second batch pools tokens (not batch means).
    b2 = {k: v[1:2] for k, v in b.items()}
    st.add(b2, N[1:2], R[1:2], mlm_logits=mlm[1:2], sop_logits=sop[1:2])
    t = st.table1()
    assert t["iterations"]["all"] == pytest.approx((10 + 20 + 20) / 14)
    assert sum(t["histogram"]["all"].values()) == t["tokens"]["all"] == 14
    assert t["mlm_accuracy"] == pytest.approx(3 / 5)
    assert t["sop_accuracy"] == pytest.approx(1 / 3)

    empty = IterationStats().table1()
    assert empty["mlm_accuracy"] is None and empty["iterations"]["all"] is None


def test_consecutive_cosine_by_hand():
    M = 4
    r2 = 1 / math.sqrt(2)
    # token 0 (N=2): h0=(1,0) h1=(0,1) h2=(1,1)=h3=h4; token 1 (N=1): h0=(1,0) h1=(1,1)=...;
    # token 2 is padding and keeps changing.
    h0 = np.array([[[1, 0], [2, 0], [1, 0]]], np.float32)
    states = np.zeros((M, 1, 3, 2), np.float32)
    states[0, 0] = [[0, 3], [1, 1], [0, 1]]
    for m in range(1, M):
        states[m, 0, :2] = [[1, 1], [1, 1]]
        states[m, 0, 2] = [-1, 0] if m % 2 else [0, 1]
    mask = np.array([[1, 1, 0]])
    groups = {"a": np.array([[True, False, True]]), "b": np.array([[False, True, False]])}
    N = np.array([[2, 1, 0]], np.float32)
    out = consecutive_cosine(states, h0, mask, groups, 2, N)
    assert out["steps"] == [0, 1, 2, 3]
    nan = math.nan
    np.testing.assert_allclose(out["overall"], [(0 + r2) / 2, (r2 + 1) / 2, nan, nan])
    np.testing.assert_allclose(out["groups"]["a"], [0, r2, nan, nan])
    np.testing.assert_allclose(out["groups"]["b"], [r2, 1, nan, nan])
    np.testing.assert_allclose(out["running"], [(0 + r2) / 2, r2, nan, nan])
    assert out["halted"][1] == 1.0  # frozen tokens: exactly 1
    assert math.isnan(out["halted"][0])  # no token halted before iteration 1
    np.testing.assert_allclose(out["running_fraction"], [1, 0.5, nan, nan])
    assert out["count"] == [2, 2, 0, 0]

    # Without h0 the steps start at n = 1; without N there is no running / halted split.
    out = consecutive_cosine(states, None, mask, groups, 2)
    assert out["steps"] == [1, 2, 3]
    np.testing.assert_allclose(out["overall"], [(r2 + 1) / 2, nan, nan])
    assert out["running"] is None
    # If all iterations ran, the repeats are genuine: cosine 1.
    out = consecutive_cosine(states, h0, mask, groups, M, N)
    np.testing.assert_allclose(out["overall"][2:], [1, 1])

    # Pooling over batches: a step counts only the batches that ran it.
    acc = CosineStats(M, ["a", "b"])
    acc.add(states, h0, mask, groups, 1, N)
    acc.add(states, h0, mask, groups, 2, N)
    np.testing.assert_allclose(acc.result()["overall"], [(0 + r2) / 2, (r2 + 1) / 2, nan, nan])
    assert acc.result()["count"] == [4, 2, 0, 0]


CFG = ACTConfig(vocab_size=64, embed_dim=16, d_model=32, n_heads=2, max_iters=4, max_len=16,
                halting_bias_init=-0.5)


def random_batches(seed, n_batches=2, B=4, T=12, P=3):
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n_batches):
        lengths = rng.integers(6, T + 1, size=B)
        tokens = rng.integers(6, 64, size=(B, T)).astype(np.int32)
        mask = (np.arange(T)[None] < lengths[:, None]).astype(np.int32)
        segments = np.zeros((B, T), np.int32)
        kind = np.zeros((B, T), np.int32)
        pos = np.zeros((B, P), np.int32)
        ids = np.zeros((B, P), np.int32)
        w = np.zeros((B, P), np.float32)
        for b, L in enumerate(lengths):
            mid = int(L) // 2
            tokens[b, 0], tokens[b, mid], tokens[b, L - 1] = CLS_ID, SEP_ID, SEP_ID
            segments[b, mid + 1:L] = 1
            cand = [t for t in range(1, L - 1) if t != mid]
            sel = rng.choice(cand, size=P - (b % 2), replace=False)
            for j, t in enumerate(sel):
                kind[b, t] = 1 + j % 3
                pos[b, j], ids[b, j], w[b, j] = t, tokens[b, t], 1.0
                if kind[b, t] == 1:
                    tokens[b, t] = 5
        tokens = tokens * mask
        out.append({"tokens": tokens, "segments": segments, "mask": mask, "mask_kind": kind,
                    "mlm_positions": pos, "mlm_ids": ids, "mlm_weights": w,
                    "sop_labels": rng.integers(0, 2, size=B).astype(np.int32)})
    return out


def test_evaluate_act_matches_model(getkey):
    model = ACTEncoder(CFG, key=getkey())
    batches = random_batches(0)
    res = evaluate_act(model, batches)
    n_sum = n_cnt = 0.0
    forward_scan = eqx.filter_jit(lambda m, *a: m.forward_scan(*a))
    for b in batches:
        out = forward_scan(model, b["tokens"], b["segments"], b["mask"])
        real = b["mask"] == 1
        n_sum += float(np.asarray(out.N_BT)[real].sum())
        n_cnt += real.sum()
    assert res["table1"]["iterations"]["all"] == pytest.approx(n_sum / n_cnt, rel=1e-6)
    assert 0 <= res["table1"]["mlm_accuracy"] <= 1 and 0 <= res["table1"]["sop_accuracy"] <= 1
    cos = res["cosine"]
    assert cos["steps"] == [0, 1, 2, 3]
    for i, n in enumerate(cos["steps"]):
        if cos["count"][i]:
            assert -1 <= cos["overall"][i] <= 1
            if not math.isnan(cos["halted"][i]):
                assert cos["halted"][i] == 1.0
        else:
            assert math.isnan(cos["overall"][i])


@pytest.mark.parametrize("kind", ["fixed", "untied"])
def test_evaluate_fixed_depth_is_M(getkey, kind):
    cfg = dataclasses.replace(CFG, halting="fixed")
    model = ACTEncoder(cfg, key=getkey()) if kind == "fixed" else UntiedEncoder(cfg, key=getkey())
    res = evaluate_act(model, random_batches(1, n_batches=1), use_while=kind == "fixed")
    for g in GROUPS:
        assert res["table1"]["iterations"][g] == cfg.max_iters
    assert res["table1"]["ponder"]["all"] == cfg.max_iters
    cos = res["cosine"]
    assert not any(math.isnan(v) for v in cos["overall"])  # all M iterations ran
    assert cos["running_fraction"] == [1.0] * cfg.max_iters


def test_writers(tmp_path):
    st = IterationStats(role_names=["noun", "verb"])
    b = hand_batch()
    N, R, mlm, sop = hand_outputs()
    st.add(b, N, R, mlm_logits=mlm, sop_logits=sop)
    md, js = write_table1(st, tmp_path / "t1.md", tmp_path / "t1.json", label="act-tiny")
    text = md.read_text()
    assert "| act-tiny | 66.7 | 50.0 | 3.33 | 3.50 | 3.00 | 3.00 | 4.00 | 1.50 | 5.00 |" in text
    assert "[MASK/original]" in text and "| noun | 3.00 | 3 |" in text
    data = json.loads(js.read_text())
    assert data["table1"]["iterations"]["[SEP]"] == pytest.approx(5.0)
    assert data["roles"]["verb"]["count"] == 2
    # no role table from a bare table1: the table and the histogram line
    assert format_table1(st.table1()).count("\n") == 7

    h0 = np.ones((1, 2, 3), np.float32)
    states = np.stack([np.ones((1, 2, 3), np.float32) * (m + 1) for m in range(3)])
    states[0, 0, 0] = [1, 0, 0]
    cos = consecutive_cosine(states, h0, np.ones((1, 2)), {"all": np.ones((1, 2), bool)}, 2,
                             np.array([[2.0, 1.0]]))
    png = plot_cosine(cos, tmp_path / "fig2.png")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    csv_path = write_cosine_table(cos, tmp_path / "fig2.csv")
    rows = csv_path.read_text().splitlines()
    assert rows[0] == "n,tokens,all,running,halted,running_fraction"
    assert len(rows) == 4 and rows[-1].startswith("2,0,nan")
