"""Evaluate a checkpoint, as JSON.

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
import math
import sys
from pathlib import Path


def parse(argv):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--run", required=True, help="run directory written by train.py")
    p.add_argument("--step", type=int, default=None, help="checkpoint step (default: latest)")
    p.add_argument("--data", default="", help="comma-separated text/JSONL files (default: the run's validation set)")
    p.add_argument("--batch", type=int, default=0, help="sequences per batch (default: the run's batch size)")
    p.add_argument("--out", default="", help="LM: JSON output path (default: <run>/eval_step<N>.json); "
                   "task: output directory (default: <run>/eval/step<N>)")
    p.add_argument("--splits", default="", help="task runs: comma-separated splits (default: the run's)")
    p.add_argument("--task-dir", default="", help="task runs: read the task from here instead")
    p.add_argument("--max", type=int, default=0, help="task runs: at most this many examples per split")
    return p.parse_args(argv)


def load_checkpoint(run: Path, step: int | None, batch: int, tokenizer: bool = True):
    """(config, model, step, tokenizer, mesh) of a checkpoint, opened read-only. Fusion and
    BERT-encoder runs pass tokenizer=False: theirs is the backbone's (possibly a Hugging Face
    one), which their job re-reads and checks itself (the tokenizer returned is then None)."""
    import jax

    from jaxdepth.config import MeshConfig
    from jaxdepth.data.prepare import check_vocab
    from jaxdepth.data.tokenizer import Tokenizer
    from jaxdepth.train.checkpoint import load_model
    from jaxdepth.train.sharding import make_mesh

    if not (run / "checkpoints").is_dir():
        raise FileNotFoundError(f"no checkpoints in {run} (expected {run / 'checkpoints'})")
    tok = Tokenizer.load(run / "data" / "tokenizer.model") if tokenizer else None
    # Data parallel only, over as many devices as divide the batch.
    cfg_batch = _saved_config(run).get("data", {}).get("batch_size", 1)
    mesh = make_mesh(MeshConfig(data=math.gcd(batch or cfg_batch, jax.device_count())))
    model, cfg, step = load_model(run, step, mesh, label="--step")
    if tokenizer:
        check_vocab(tok, cfg.model.vocab_size, str(run / "data" / "tokenizer.model"))
    return cfg, model, step, tok, mesh


def evaluate_checkpoint(run: Path, step: int | None = None, data: str = "", batch: int = 0) -> dict:
    """Perplexity of an LM checkpoint."""
    from jaxdepth.data.pipeline import eval_batches, load_tokens, tokenize_documents
    from jaxdepth.data.readers import read_corpus
    from jaxdepth.train.jobs import evaluate
    from jaxdepth.train.sharding import batch_sharding

    cfg, model, step, tok, mesh = load_checkpoint(run, step, batch)
    batch = batch or cfg.data.batch_size
    if data:
        paths = [p.strip() for p in data.split(",") if p.strip()]
        tokens = tokenize_documents(read_corpus(paths), tok)
        source = paths
    else:
        tokens = load_tokens(run / "data" / "valid.npy")
        source = "validation set of the run"
    batches = eval_batches(tokens, seq_len=cfg.data.seq_len, batch_size=batch)
    result = evaluate(model, batches, batch_sharding(mesh))
    return {"run": str(run), "step": step, "data": source, "seq_len": cfg.data.seq_len,
            "tokens": result["valid_tokens"], "loss": result["valid_loss"],
            "perplexity": result["valid_ppl"]}


def evaluate_task_checkpoint(run: Path, step: int | None = None, splits: str = "",
                             task_dir: str = "", batch: int = 0, max_examples: int = 0,
                             out: str = "") -> dict:
    """Exact match of a fine-tuned checkpoint on whole splits; writes predictions + summary."""
    import dataclasses

    from jaxdepth.data.task_data import resolve_eval_splits, task_splits
    from jaxdepth.train.jobs import fixed_subset
    from jaxdepth.train.task_eval import Geometry, evaluate_splits, summarize, write_predictions

    cfg, model, step, tok, _ = load_checkpoint(run, step, batch)
    task = dataclasses.replace(cfg.task, dir=task_dir or cfg.task.dir, eval_splits=splits,
                               eval_max=max_examples)
    all_splits, dev, gen = task_splits(task)
    names = resolve_eval_splits(task, all_splits, dev, gen)
    chosen = {s: fixed_subset(all_splits[s], max_examples, task.seed) for s in names}
    geo = Geometry.fit([e for ex in chosen.values() for e in ex], tok,
                       batch or cfg.task.eval_batch or cfg.data.batch_size)
    records = evaluate_splits(model, tok, chosen, geo)
    summary = {"run": str(run), "step": step, "task": task.name, "task_dir": task.dir,
               **summarize(records, dev, gen)}
    directory = Path(out) if out else run / "eval" / f"step{step}"
    summary["files"] = write_predictions(directory, records, summary)
    return summary


def main(argv) -> int:
    args = parse(argv)
    from jaxdepth.runtime import tune_malloc

    tune_malloc()
    from jaxdepth.config import ConfigError
    run = Path(args.run)
    saved = _saved_config(run)
    arch = saved.get("model", {}).get("arch", "decoder")
    task = saved.get("task", {}).get("name", "")
    try:
        if task == "ner":
            out = evaluate_ner_checkpoint(run, args.step, args.splits, args.out)
            print(json.dumps(out, indent=2))
            return 0
        if task == "mlm" or arch == "encoder":
            out = evaluate_mlm_checkpoint(run, args.step, args.data, args.batch)
            text = json.dumps(out, indent=2)
            print(text)
            Path(args.out or run / f"eval_step{out['step']}.json").write_text(text + "\n")
            return 0
        if arch != "decoder":
            if task:
                raise ValueError(f"{run} fine-tunes an encoder on a probing task: its dev/test "
                                 f"results are in {run / 'analysis' / 'probe.json'}")
            out = evaluate_encoder_checkpoint(run, args.step, args.data, args.batch, args.out)
            print(json.dumps(out, indent=2))
            return 0
        if task:
            out = evaluate_task_checkpoint(run, args.step, args.splits, args.task_dir, args.batch,
                                           args.max, args.out)
            print(json.dumps({k: out[k] for k in ("step", "task", "id_accuracy", "gen_accuracy",
                                                  "lexical", "structural", "files") if k in out},
                             indent=2))
            return 0
        out = evaluate_checkpoint(run, args.step, args.data, args.batch)
    except (ConfigError, FileNotFoundError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    text = json.dumps(out, indent=2)
    print(text)
    Path(args.out or run / f"eval_step{out['step']}.json").write_text(text + "\n")
    return 0


def evaluate_encoder_checkpoint(run: Path, step: int | None = None, data: str = "",
                                batch: int = 0, out: str = "") -> dict:
    """Table 1 (MLM / SOP accuracy, mean iterations per token group) and Fig. 2 (cosine of
    consecutive iteration states) of an encoder checkpoint, on the run's validation batches or
    on MLM batches built from other text files."""
    import dataclasses

    from jaxdepth.analysis.act_stats import (evaluate_act, plot_cosine, write_cosine_table,
                                             write_table1)
    from jaxdepth.train.encoder_job import EncoderJob

    cfg, model, step, _, _ = load_checkpoint(run, step, batch)
    if data:
        cfg = dataclasses.replace(cfg, data=dataclasses.replace(cfg.data, valid=data))
    if batch:
        cfg = dataclasses.replace(cfg, data=dataclasses.replace(cfg.data, batch_size=batch))
    job = EncoderJob(cfg, run, primary=False, barrier=lambda: None)  # reads, never writes
    res = evaluate_act(model, job.valid, use_while=cfg.model.arch == "act")
    directory = Path(out) if out else run / "eval" / f"step{step}"
    directory.mkdir(parents=True, exist_ok=True)
    label = f"{cfg.model.arch} step {step}"
    files = [write_table1(res, directory / "table1.md", directory / "table1.json", label=label),
             write_cosine_table(res["cosine"], directory / "cosine.csv"),
             plot_cosine(res["cosine"], directory / "cosine.png", title=label)]
    return {"run": str(run), "step": step, "data": data or "validation batches of the run",
            "table1": res["table1"], "files": [str(f) for f in files]}


def evaluate_mlm_checkpoint(run: Path, step: int | None = None, data: str = "",
                            batch: int = 0) -> dict:
    import dataclasses

    from jaxdepth.train.mlm_job import MLMJob, mlm_perplexity

    cfg, model, step, _, _ = load_checkpoint(run, step, batch, tokenizer=False)
    if data:
        cfg = dataclasses.replace(cfg, data=dataclasses.replace(cfg.data, valid=data))
    if batch:
        cfg = dataclasses.replace(cfg, data=dataclasses.replace(cfg.data, batch_size=batch))
    job = MLMJob(cfg, run, primary=False, barrier=lambda: None)  # reads, never writes
    return {"run": str(run), "step": step, "data": data or "validation batches of the run",
            **mlm_perplexity(model, job.valid)}


def evaluate_ner_checkpoint(run: Path, step: int | None = None, splits: str = "",
                            out: str = "") -> dict:
    from jaxdepth.analysis import seqeval
    from jaxdepth.train.ner_job import NERJob, predict_tags

    cfg, model, step, _, _ = load_checkpoint(run, step, 0, tokenizer=False)
    job = NERJob(cfg, run, primary=False, barrier=lambda: None)
    directory = Path(out) if out else run / "eval" / f"step{step}"
    directory.mkdir(parents=True, exist_ok=True)
    res = {"run": str(run), "step": step}
    for split in [s.strip() for s in (splits or "dev,test").split(",") if s.strip()]:
        if split not in job.sentences or split == "train":
            raise ValueError(f"--splits: {split!r} is not one of dev, test")
        sents = job.sentences[split]
        pred = predict_tags(model, job.arrays[split], [len(x.tokens) for x in sents], job.labels,
                            cfg.task.eval_batch or cfg.data.batch_size)
        res[split] = seqeval.f1([list(x.tags) for x in sents], pred)
        with open(directory / f"{split}.jsonl", "w") as f:
            for x, p in zip(sents, pred):
                f.write(json.dumps({"tokens": list(x.tokens), "gold": list(x.tags),
                                    "prediction": p}) + "\n")
    (directory / "ner.json").write_text(json.dumps(res, indent=2) + "\n")
    return res


def _saved_config(run: Path) -> dict:
    """The run's resolved config.json as a dict ({} when absent: load_model names the problem)."""
    config = run / "config.json"
    return json.loads(config.read_text()) if config.is_file() else {}


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
