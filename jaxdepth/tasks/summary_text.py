"""What train.py prints of a run's summary (summary.json): every kind's text, in one place.

A kind's results are recognised by the metric its evaluation writes (``RESULTS``: one key per
kind, unique to it), not by the kind's name, so the text follows the summary alone; a summary
read back from summary.json prints the same as the one the run returned.
"""
from __future__ import annotations

import os
from typing import Callable


def _lm(s: dict) -> list[str]:
    lines = [f"validation perplexity {s['valid_ppl']:.3f} (loss {s['valid_loss']:.4f})"]
    if "grammatical" in s:
        lines.append(f"grammatical: {s['grammatical']:.0%} of "
                     f"{s['grammar_check']['continuations']} sampled continuations of "
                     f"validation prompts derive from the grammar's rules")
    return lines


def _prefix_lm(s: dict) -> list[str]:
    scores = ", ".join(f"{k} {s[k]:.3f}" for k in ("id_accuracy", "gen_accuracy", "lexical",
                                                    "structural") if s.get(k) is not None)
    lines = [f"dev loss {s['dev_loss']:.4f}; exact match: {scores}"]
    unk = s["unk"]
    if unk["examples_with_unk"]:
        lines.append(f"warning: {unk['examples_with_unk']} of {unk['examples']} examples "
                     f"contain pieces unknown to the tokenizer, e.g. "
                     f"{list(unk['unknown_words'])[:5]}")
    return lines


def _encoder_pretrain(s: dict) -> list[str]:
    t1 = s["table1"]
    it = ", ".join(f"{g} {v:.2f}" for g, v in t1["iterations"].items() if v is not None)
    hist, total = t1["histogram"]["all"], t1["tokens"]["all"]
    shares = ", ".join(f"{n}: {100 * c / total:.1f}%" for n, c in hist.items()) if total else ""
    return [f"MLM accuracy {100 * t1['mlm_accuracy']:.1f}%, SOP accuracy "
            f"{100 * t1['sop_accuracy']:.1f}%", f"mean iterations: {it}",
            f"tokens by iterations: {shares}", f"Table 1 and Fig. 2: {s['analysis']}"]


def _probe(s: dict) -> list[str]:
    p = s["probe"]
    return [f"{p['arch']} on {p['task']}: test accuracy {100 * p['test']['accuracy']:.1f}% "
            f"(dev {100 * p['dev']['accuracy']:.1f}%), mean iterations "
            f"{p['test']['mean_iterations']:.2f}", f"results: {s['analysis']}"]


def _mlm(s: dict) -> list[str]:
    return [f"held-out MLM perplexity {s['mlm_perplexity']:.3f} (loss {s['mlm_loss']:.4f}, "
            f"accuracy {100 * s['mlm_accuracy']:.1f}%)"]


def _ner(s: dict) -> list[str]:
    return [f"best dev F1 {100 * s['best_dev_f1']:.2f} at step {s['best_step']} (test F1 "
            f"there {100 * s['test_f1_at_best']:.2f}; final test F1 {100 * s['test_f1']:.2f})",
            f"results: {s['analysis']}"]


# The metric that marks each kind's results, and its lines: causal LM, prefix-LM fine-tuning,
# ACT / ALBERT / BERT MLM + SOP pretraining, probing, (fusion) MLM, fusion NER.
RESULTS: tuple[tuple[str, Callable[[dict], list[str]]], ...] = (
    ("valid_ppl", _lm), ("dev_loss", _prefix_lm), ("table1", _encoder_pretrain),
    ("probe", _probe), ("mlm_perplexity", _mlm), ("best_dev_f1", _ner))


def results(s: dict) -> str:
    """A finished run's (or one trial's) results, after its train loss."""
    found = [lines for key, lines in RESULTS if key in s]
    if len(found) != 1:
        raise ValueError(f"summary: expected the results of one kind of run (one of "
                         f"{[k for k, _ in RESULTS]}), found {len(found)}")
    return "\n".join(found[0](s))


def _trials(s: dict) -> list[str]:
    frozen = f", {s['n_frozen']} frozen" if s["n_frozen"] else ""
    out = [f"\nfinished step {s['step']}: {s['n_trials']} trials{frozen}"]
    for t in s["trials"]:
        name = ", ".join(f"{k}={v}" for k, v in t["settings"].items())
        text = "frozen (non-finite)" if t["frozen"] else (
            f"train loss {t['train_loss']:.4f}, {results(t)}")
        out.append(f"trial {t['trial']} ({name}): " + text.replace("\n", "\n    "))
    every = {"mean": s.get("mean"), "ci95": s.get("ci95"),
             "trials": [t["trial"] for t in s["trials"] if not t["frozen"]]}
    for g in s.get("groups") or [every]:
        shown = ", ".join(f"{k} {m:.4g} ± {g['ci95'][k]:.2g}" for k, m in g["mean"].items()
                          if k in g["ci95"] and not k.endswith(("_tokens", "_step")))
        of = ", ".join(f"{k}={v}" for k, v in g.get("settings", {}).items())
        if shown:
            out.append(f"mean ± 95% CI{' of ' + of if of else ''} over trials "
                       f"{g['trials']}: {shown}")
    return out


def _solo(s: dict) -> list[str]:
    train_loss = f"train loss {s['train_loss']:.4f}, " if "train_loss" in s else ""
    out = [f"\nfinished step {s['step']}: {train_loss}{results(s)}"]
    if "tokens_per_s" in s:
        out.append(f"throughput {s['tokens_per_s']:,.0f} tokens/s, MFU {100 * s['mfu']:.1f}% "
                   f"of {s['peak_flops'] / 1e9:,.0f} GFLOP/s per device ({s['peak_source']})")
    out += [f"  sample: {smp['prompt']!r} -> {smp['continuation']!r}"
            for smp in s.get("samples", [])]
    return out


def summary_text(s: dict) -> str:
    """What train.py prints at the end of a run: its results (each trial's, then their mean
    and 95% CI), or where it stopped, and where its files are."""
    if not s["done"]:
        out = [f"stopped at step {s['step']} (run.stop_after), checkpoint of step {s['step']} "
               f"saved; resume with the same command."]
    else:
        out = _trials(s) if "trials" in s else _solo(s)
    if "predictions" in s:
        out.append(f"predictions: {s['predictions']['summary']} and <split>.jsonl beside it")
    out.append(f"checkpoints: {s['checkpoints']}\nmetrics:     {s['metrics']} "
               f"(TensorBoard: {s['tensorboard']})")
    if s["done"]:
        out.append(f"summary:     {os.path.join(s['run_dir'], 'summary.json')}")
    return "\n".join(out)
