"""Evaluate a checkpoint, as JSON: ``python -m jaxdepth.eval`` (also ``jaxdepth-eval``, or
``python eval.py`` in a checkout).

A language-model run: perplexity on its validation set or any text files.

    python eval.py --run runs/default                       # the run's own validation set
    python eval.py --run runs/default --data a.txt,b.jsonl  # any text / JSONL files
    python eval.py --run runs/default --step 200 --out ppl.json

An encoder run (model.arch act / albert / bert): the paper's Table 1 and Fig. 2 statistics.

    python eval.py --run runs/act-tiny                      # -> runs/act-tiny/eval/step<N>/
    python eval.py --run runs/act-tiny --data wiki.valid.txt

A BERT-encoder MLM run (model.arch encoder) or an MLM-with-fusion run (task.name mlm):
held-out MLM perplexity, on the run's validation batches or MLM batches of other text.

    python eval.py --run runs/bert-mini --data wiki.valid.txt

A fusion NER run (task.name ner): seqeval micro F1 of a checkpoint on dev and test (or
--splits), with the tagged sentences as JSONL.

    python eval.py --run runs/ner-dwatt-fe --step 100      # -> runs/ner-dwatt-fe/eval/step100/

A fine-tuned (prefix-LM) run: exact match of greedy decoding on any split of its task (whole
splits), predictions (input, gold, prediction, correct, type) as JSONL next to a summary JSON.

    python eval.py --run runs/ft --splits gen               # -> runs/ft/eval/step<N>/gen.jsonl
    python eval.py --run runs/ft --splits dev,test,gen --task-dir other/copy/of/cogs
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


def parse(argv):
    from jaxdepth.tasks.eval_request import add_flags

    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--run", required=True, help="run directory written by train.py")
    p.add_argument("--trial", type=int, default=None,
                   help="a run with trials (required there, refused elsewhere): evaluate this "
                        "trial (exported first to <run>/trials/<k>, a single-trial run that the "
                        "results go to)")
    add_flags(p)  # what a checkpoint's evaluation reads (eval_request.EvalRequest)
    p.add_argument("--debug", action="store_true",
                   help="print the traceback of an error as well as its one line")
    return p.parse_args(argv)


def evaluate(run, *, trial: int | None = None, **request) -> dict:
    """What eval.py prints for a checkpoint of `run`, whatever kind of run it is (the files it
    writes are named in the result); request: the fields of an EvalRequest (step, data, out,
    ...), each eval.py's flag."""
    from jaxdepth.tasks.eval_request import EvalRequest

    return _evaluate(Path(run), EvalRequest(**request), trial)


def _evaluate(run: Path, request, trial: int | None) -> dict:
    import dataclasses

    from jaxdepth.config import Config, ConfigError
    from jaxdepth.config.trials import trial_configs
    from jaxdepth.config.run_kinds import kind_of
    from jaxdepth.tasks import task_for
    from jaxdepth.tasks.eval_request import saved_config

    def task_of(run_dir: Path):
        try:
            cfg = Config.from_dict(saved_config(run_dir))
        except ConfigError as e:  # a saved config this version cannot read: name the file
            raise ConfigError(f"{run_dir / 'config.json'}: {e}", field=e.field) from None
        cfgs = trial_configs(cfg)
        cfg = cfgs[0] if len(cfgs) == 1 else cfg  # a solo run: {seed} paths as it trained
        return cfg, task_for(cfg), len(cfgs)

    cfg, task, n_trials = task_of(run)
    # A run with trials saves the K models stacked: restored as one model, every checkpoint
    # would read as corrupt (its tree does not match). Told from the config before restoring.
    if trial is None and n_trials > 1:
        raise ConfigError(f"--trial: {run} is a run with {n_trials} trials, each its own model; "
                          f"give --trial k (0..{n_trials - 1}) to evaluate trial k", field="trial")
    if trial is not None and n_trials == 1 and (run / "config.json").is_file():
        raise ConfigError(f"--trial {trial}: {run} is a run without trials (no run.seeds or "
                          f"trials list in its config.json); evaluate it without --trial",
                          field="trial")
    # A flag this kind of run does not read would be silently ignored: refused before anything
    # is written (a trial's export). A kind that reads none says why itself.
    given = [f for f in dataclasses.fields(request)
             if getattr(request, f.name) != f.default and f.name not in task.EVAL_READS]
    if given and task.EVAL_READS:
        reads = ", ".join(f.metadata["flag"] for f in dataclasses.fields(request)
                          if f.name in task.EVAL_READS)
        flag = given[0].metadata["flag"]
        raise ConfigError(f"{flag}: a {kind_of(cfg).NAME} run's evaluation does not read it (it "
                          f"reads: {reads})", field=flag)
    if trial is not None:
        from jaxdepth.trainer.trials import export_trial

        run = export_trial(run, trial, task_for)
        cfg, task, _ = task_of(run)
    return task.evaluate_checkpoint(run, request)


def main(argv) -> int:
    args = parse(argv)
    from jaxdepth.tasks.eval_request import request_of
    from jaxdepth.errors import ResultNotWritten, run_main

    def body() -> int:
        try:
            result = _evaluate(Path(args.run), request_of(args), args.trial)
        except ResultNotWritten as e:  # the result first, then the one line saying why
            print(json.dumps(e.result, indent=2), flush=True)
            raise
        print(json.dumps(result, indent=2))
        return 0

    return run_main(body, debug=args.debug)


def command() -> None:
    """The command (``python -m jaxdepth.eval``, ``jaxdepth-eval``, eval.py)."""
    from jaxdepth.errors import exit_process, quiet_interrupts
    from jaxdepth.trainer.runtime import tune_malloc

    quiet_interrupts()  # a Ctrl-C while jax is imported: one line, not a traceback
    tune_malloc()
    exit_process(main(sys.argv[1:]))


if __name__ == "__main__":
    command()
