"""Generation speed of the embedded grammar: sentences and documents per second.

Every fresh run builds its corpus (and the grammar tasks their data) with
``jaxdepth.data.embedded.grammar``, in pure Python. This times ``generate(n, seed)`` (independent
sentences) and ``corpus_texts(docs, seed)`` (documents with recurring entities, the pretraining
corpus) after one untimed warm-up call (the lemma pools are built once per process), as the
median of ``--repeats`` calls, and compares the sentence time with the target of 2 s for 20,000
sentences (scaled to ``--sentences``). tests/data/embedded/test_grammar.py checks what keeps generation fast
without timing it: a bounded number of uniform draws per sentence, drawn from numpy in blocks,
and cached lemma pools.

    python benchmarks/bench_grammar.py                  # 20,000 sentences, 3,000 documents
    python benchmarks/bench_grammar.py --sentences 100000 --repeats 3 --out g.json
"""
from __future__ import annotations

import statistics

# first: puts the checkout on sys.path and tunes malloc before anything allocates
from common import arg_parser, environment, timed, write_json

from jaxdepth.data.embedded import grammar

TARGET_S_PER_20K = 2.0  # seconds for 20,000 sentences


def time_calls(fn, repeats: int) -> list[float]:
    """Seconds of each of `repeats` calls of fn (pure Python: it returns when done)."""
    return [timed(fn, block=False)[1] for _ in range(repeats)]


def main(argv: list[str] | None = None) -> dict:
    p = arg_parser(__doc__)
    p.add_argument("--sentences", type=int, default=20_000, help="sentences per generate() call")
    p.add_argument("--docs", type=int, default=3_000, help="documents per corpus_texts() call")
    p.add_argument("--repeats", type=int, default=5, help="timed calls of each")
    p.add_argument("--seed", type=int, default=11)
    p.add_argument("--out", default="bench_grammar.json")
    args = p.parse_args(argv)
    if args.repeats < 1 or args.sentences < 1 or args.docs < 1:
        raise SystemExit("--sentences, --docs and --repeats must be >= 1")

    grammar.generate(100, seed=0)  # warm-up: builds the lemma pools
    sents = time_calls(lambda: grammar.generate(args.sentences, seed=args.seed), args.repeats)
    docs = time_calls(lambda: grammar.corpus_texts(args.docs, seed=args.seed), args.repeats)
    med_s, med_d = statistics.median(sents), statistics.median(docs)
    limit = TARGET_S_PER_20K * args.sentences / 20_000
    out = {
        "benchmark": "bench_grammar", "sentences": args.sentences, "docs": args.docs,
        "repeats": args.repeats, "seed": args.seed, **environment(),
        "timing": "median of --repeats calls after one warm-up call",
        "generate_s": med_s, "generate_s_min": min(sents), "generate_s_all": sents,
        "sentences_per_s": args.sentences / med_s,
        "corpus_texts_s": med_d, "corpus_texts_s_min": min(docs), "corpus_texts_s_all": docs,
        "docs_per_s": args.docs / med_d,
        "target": f"generate: <= {TARGET_S_PER_20K} s per 20,000 sentences",
        "target_s": limit, "within_target": bool(med_s <= limit),
    }
    print(f"generate({args.sentences}): {med_s:.3f} s median ({out['sentences_per_s']:,.0f} "
          f"sentences/s; target <= {limit:.3f} s: {'met' if out['within_target'] else 'MISSED'})")
    print(f"corpus_texts({args.docs}): {med_d:.3f} s median ({out['docs_per_s']:,.0f} docs/s)")
    write_json(args.out, out)
    print(f"wrote {args.out}")
    return out


if __name__ == "__main__":
    main()
