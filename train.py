"""Train (or resume) a jaxdepth model.  python train.py --help  lists every field."""
from __future__ import annotations

import os
import sys


def main(argv: list[str]) -> int:
    from jaxdepth.runtime import tune_malloc

    tune_malloc()  # before jax allocates anything
    from jaxdepth.cli import parse_args
    from jaxdepth.config import ConfigError

    try:
        cfg = parse_args(argv, prog="train.py")
    except ConfigError as e:
        print(f"config error: {e}", file=sys.stderr)
        return 2

    import jax

    if cfg.mesh.num_processes > 1:
        jax.config.update("jax_cpu_collectives_implementation", "gloo")
        jax.distributed.initialize(coordinator_address=cfg.mesh.coordinator,
                                   num_processes=cfg.mesh.num_processes,
                                   process_id=cfg.mesh.process_id)

    from jaxdepth.train.loop import NonFiniteLossError, train

    try:
        summary = train(cfg)
    except (ConfigError, FileNotFoundError, ValueError, NonFiniteLossError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    if jax.process_index() == 0:
        print_summary(summary)
    return 0


def print_summary(s: dict) -> None:
    if not s["done"]:
        print(f"stopped at step {s['step']}; resume with the same command.")
    else:
        train_loss = f"train loss {s['train_loss']:.4f}, " if "train_loss" in s else ""
        if s.get("task") == "ner":
            print(f"\nfinished step {s['step']}: {train_loss}best dev F1 {100 * s['best_dev_f1']:.2f} "
                  f"at step {s['best_step']} (test F1 there {100 * s['test_f1_at_best']:.2f}; "
                  f"final test F1 {100 * s['test_f1']:.2f})\nresults: {s['analysis']}")
        elif "mlm_perplexity" in s:
            print(f"\nfinished step {s['step']}: {train_loss}held-out MLM perplexity "
                  f"{s['mlm_perplexity']:.3f} (loss {s['mlm_loss']:.4f}, accuracy "
                  f"{100 * s['mlm_accuracy']:.1f}%)")
        elif "probe" in s:
            p = s["probe"]
            print(f"\nfinished step {s['step']}: {train_loss}{p['arch']} on {p['task']}: "
                  f"test accuracy {100 * p['test']['accuracy']:.1f}% "
                  f"(dev {100 * p['dev']['accuracy']:.1f}%), mean iterations "
                  f"{p['test']['mean_iterations']:.2f}\nresults: {s['analysis']}")
        elif "arch" in s:
            t1 = s["table1"]
            it = ", ".join(f"{g} {v:.2f}" for g, v in t1["iterations"].items() if v is not None)
            print(f"\nfinished step {s['step']}: {train_loss}MLM accuracy "
                  f"{100 * t1['mlm_accuracy']:.1f}%, SOP accuracy {100 * t1['sop_accuracy']:.1f}%\n"
                  f"mean iterations: {it}\nTable 1 and Fig. 2: {s['analysis']}")
        elif "task" in s:
            scores = ", ".join(f"{k} {s[k]:.3f}" for k in ("id_accuracy", "gen_accuracy", "lexical",
                                                            "structural") if s.get(k) is not None)
            print(f"\nfinished step {s['step']}: {train_loss}dev loss {s['dev_loss']:.4f}; "
                  f"exact match: {scores}")
            unk = s["unk"]
            if unk["examples_with_unk"]:
                print(f"warning: {unk['examples_with_unk']} of {unk['examples']} examples contain "
                      f"pieces unknown to the tokenizer, e.g. {list(unk['unknown_words'])[:5]}")
        else:
            print(f"\nfinished step {s['step']}: {train_loss}"
                  f"validation perplexity {s['valid_ppl']:.3f} (loss {s['valid_loss']:.4f})")
        if "tokens_per_s" in s:
            print(f"throughput {s['tokens_per_s']:,.0f} tokens/s, MFU {100 * s['mfu']:.1f}% "
                  f"of {s['peak_flops'] / 1e9:,.0f} GFLOP/s per device ({s['peak_source']})")
        for smp in s.get("samples", []):
            print(f"  sample: {smp['prompt']!r} -> {smp['continuation']!r}")
    if "predictions" in s:
        print(f"predictions: {s['predictions']['summary']} and <split>.jsonl beside it")
    print(f"checkpoints: {s['checkpoints']}\nmetrics:     {s['metrics']} (TensorBoard: {s['tensorboard']})")
    if s["done"]:
        print(f"summary:     {os.path.join(s['run_dir'], 'summary.json')}")


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
