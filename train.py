"""Train (or resume) a jaxdepth model.  python train.py --help  lists every field."""
from __future__ import annotations

import os
import sys


def main(argv: list[str]) -> int:
    from jaxdepth.errors import run_main

    return run_main(lambda: _train(argv), debug="--debug" in argv)


def _train(argv: list[str]) -> int:
    from jaxdepth.cli import parse_args, preset_lines

    cfg = parse_args(argv, prog="train.py")
    lines = preset_lines(cfg)  # what the preset and the run kind's recipe set
    if cfg.mesh.process_id == 0 and lines:
        print("\n".join(lines))

    import jax

    if cfg.mesh.num_processes > 1:
        jax.config.update("jax_cpu_collectives_implementation", "gloo")
        jax.distributed.initialize(coordinator_address=cfg.mesh.coordinator,
                                   num_processes=cfg.mesh.num_processes,
                                   process_id=cfg.mesh.process_id)

    from jaxdepth.config import trial_configs
    from jaxdepth.tasks import task_for
    from jaxdepth.trainer.loop import train

    tasks = [task_for(c) for c in trial_configs(cfg)]  # one per trial (trainer/trials.py)
    task = tasks[0]
    summary = train(cfg, tasks if len(tasks) > 1 else task)
    if jax.process_index() == 0:
        print_summary(summary, task)
    return 0


def print_summary(s: dict, task) -> None:
    if not s["done"]:
        print(f"stopped at step {s['step']} (run.stop_after), checkpoint of step {s['step']} "
              f"saved; resume with the same command.")
    elif "trials" in s:  # a run with trials: each trial's report, then their mean and CI
        frozen = f", {s['n_frozen']} frozen" if s["n_frozen"] else ""
        print(f"\nfinished step {s['step']}: {s['n_trials']} trials{frozen}")
        for t in s["trials"]:
            name = ", ".join(f"{k}={v}" for k, v in t["settings"].items())
            text = "frozen (non-finite)" if t["frozen"] else (
                f"train loss {t['train_loss']:.4f}, {task.report(t)}")
            print(f"trial {t['trial']} ({name}): " + text.replace("\n", "\n    "))
        every = {"mean": s.get("mean"), "ci95": s.get("ci95"),
                 "trials": [t["trial"] for t in s["trials"] if not t["frozen"]]}
        for g in s.get("groups") or [every]:
            shown = ", ".join(f"{k} {m:.4g} ± {g['ci95'][k]:.2g}" for k, m in g["mean"].items()
                              if k in g["ci95"] and not k.endswith(("_tokens", "_step")))
            of = ", ".join(f"{k}={v}" for k, v in g.get("settings", {}).items())
            if shown:
                print(f"mean ± 95% CI{' of ' + of if of else ''} over trials "
                      f"{g['trials']}: {shown}")
    else:
        train_loss = f"train loss {s['train_loss']:.4f}, " if "train_loss" in s else ""
        print(f"\nfinished step {s['step']}: {train_loss}{task.report(s)}")
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
    from jaxdepth.runtime import tune_malloc

    tune_malloc()  # the process is ours: before jax allocates anything
    sys.exit(main(sys.argv[1:]))
