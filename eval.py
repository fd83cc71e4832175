"""Evaluate a checkpoint: perplexity on a text set, as JSON.

    python eval.py --run runs/default                       # the run's own validation set
    python eval.py --run runs/default --data a.txt,b.jsonl  # any text / JSONL files
    python eval.py --run runs/default --step 200 --out ppl.json
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
    p.add_argument("--out", default="", help="JSON output path (default: <run>/eval_step<N>.json)")
    return p.parse_args(argv)


def evaluate_checkpoint(run: Path, step: int | None = None, data: str = "", batch: int = 0) -> dict:
    import jax

    from jaxdepth.config import Config, MeshConfig
    from jaxdepth.data.pipeline import eval_batches, load_tokens, tokenize_documents
    from jaxdepth.data.prepare import check_vocab
    from jaxdepth.data.readers import read_corpus
    from jaxdepth.data.tokenizer import Tokenizer
    from jaxdepth.train import checkpoint as ckpt
    from jaxdepth.train.jobs import evaluate
    from jaxdepth.train.optim import make_optimizer
    from jaxdepth.train.sharding import batch_sharding, make_mesh
    from jaxdepth.train.state import state_shardings

    if not (run / "checkpoints").is_dir():
        raise FileNotFoundError(f"no checkpoints in {run} (expected {run / 'checkpoints'})")
    mngr = ckpt.open_manager(run, read_only=True)
    steps = mngr.all_steps()
    if not steps:
        raise FileNotFoundError(f"no complete checkpoint in {run / 'checkpoints'}")
    step = max(steps) if step is None else step
    if step not in steps:
        raise ValueError(f"--step {step}: not in {run / 'checkpoints'} (available: {sorted(steps)})")
    cfg = Config.from_dict(ckpt.saved_config(mngr, step))
    tok = Tokenizer.load(run / "data" / "tokenizer.model")
    check_vocab(tok, cfg.model.vocab_size, str(run / "data" / "tokenizer.model"))

    batch = batch or cfg.data.batch_size
    mesh = make_mesh(MeshConfig(data=math.gcd(batch, jax.device_count())))  # data parallel only
    tx = make_optimizer(cfg.optim, cfg.run.steps)
    state = ckpt.restore(mngr, step, *state_shardings(cfg, tx, mesh))
    mngr.close()

    if data:
        paths = [p.strip() for p in data.split(",") if p.strip()]
        tokens = tokenize_documents(read_corpus(paths), tok)
        source = paths
    else:
        tokens = load_tokens(run / "data" / "valid.npy")
        source = "validation set of the run"
    batches = eval_batches(tokens, seq_len=cfg.data.seq_len, batch_size=batch)
    result = evaluate(state.model, batches, batch_sharding(mesh))
    return {"run": str(run), "step": step, "data": source, "seq_len": cfg.data.seq_len,
            "tokens": result["valid_tokens"], "loss": result["valid_loss"],
            "perplexity": result["valid_ppl"]}


def main(argv) -> int:
    args = parse(argv)
    from jaxdepth.runtime import tune_malloc

    tune_malloc()
    from jaxdepth.config import ConfigError
    try:
        out = evaluate_checkpoint(Path(args.run), args.step, args.data, args.batch)
    except (ConfigError, FileNotFoundError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    text = json.dumps(out, indent=2)
    print(text)
    Path(args.out or Path(args.run) / f"eval_step{out['step']}.json").write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
