"""Named-entity recognition on a backbone with a fusion module (docs/design.md §4).

Data: a WikiAnn or CoNLL-2003 directory (task.dir), IOB2 throughout; with task.n_shot = N the
training set is N * C sentences drawn without replacement with task.seed (C entity types).
Only the first sub-token of a word carries its label; the loss is the mean cross-entropy over
the batch's labelled words. Every evaluation point scores dev and test with seqeval's micro F1
(words that did not fit in data.seq_len count as predicted O) and is appended to evals.jsonl;
the result is the best dev F1 over training and the test F1 at that point, written with the
whole curve to ``<run>/analysis/ner.json``. In fusion.mode=fe (with fusion.cache) the frozen
backbone runs once per sentence and training and evaluation read its states from a cache
(tasks/state_cache.py).
"""
from __future__ import annotations

import abc
import json
from dataclasses import dataclass

import logging
from pathlib import Path
from typing import Any, ClassVar

import equinox as eqx
import grain
import jax
import jax.numpy as jnp
import numpy as np

from ..analysis import entity_f1
from ..config import Config, ConfigError
from ..data.finetune import ner_sentences
from ..data.corpus.pipeline import ExampleBatchSource, sample_ids
from ..errors import writing_result
from ..models.fusions import FusionMethod, Sentence, Words
from .losses import batch_totals, labelled_xent_sum
from .eval_request import EvalRequest, load_checkpoint
from ..models.trial_axis import Models
from ..config.run_kinds.fusion_ner import FusionNER
from . import state_cache
from .backbones import FusionTask, backbone_words
from .task_base import same_arrays

log = logging.getLogger(__name__)
SPLITS = ("dev", "test")


def ner_objective(n_active: int = 0, batches: type["NERBatches"] | None = None):
    """The mean cross-entropy over the batch's labelled words; `n_active`: a bound on the word
    slots in use in a micro-batch (FusedModel runs its fusion at those only), 0: every slot.
    `batches`: the run's batch format (NERBatches), by default word pieces that the backbone
    runs on."""
    batches = batches or TokenBatches

    def objective(model, mb, key, totals):
        ce = labelled_xent_sum(batches.logits(model, mb, key, n_active), mb["labels"]) \
            / totals["labels"]
        return ce, {"loss": ce, "tokens": jnp.sum(mb["mask"].astype(jnp.float32))}

    return objective, batch_totals("labels")


@eqx.filter_jit
def _predict(model, tokens, segments, mask, positions, n_active):
    return jnp.argmax(model(tokens, segments, mask, positions, n_active=n_active), -1)


@eqx.filter_jit
def _predict_from_states(model, states, mask, positions):
    return jnp.argmax(model.logits_from_states(states, mask, positions), -1)


@eqx.filter_jit
def _predict_words(model, words_KLD):
    return jnp.argmax(model.word_logits(jnp.moveaxis(words_KLD, 1, 0)), -1)


def _predict_rows(models: Models, arrays: dict, batch: int, keys: tuple[str, ...], predict,
                  *extra) -> list[np.ndarray]:
    """predict(model, *arrays[keys], *extra) over a split's rows, `batch` at a time (the last
    batch padded, so one compile serves all), per model."""
    n = len(arrays[keys[0]])
    preds = []
    for i in range(0, n, batch):
        part = state_cache.pad_rows({k: arrays[k][i:i + batch] for k in keys}, batch)
        preds.append(models(predict, *(part[k] for k in keys), *extra))
    return [np.concatenate([np.asarray(p[k]) for p in preds])[:n] for k in range(len(models))]


EVAL_WORDS = 2048  # words per call when scoring packed states: one compilation for any split


# ------------------------------------------------------------------------- batch formats

class NERBatches(abc.ABC):
    """How an NER run's sentences reach the model, in training and in evaluation: one class
    per format, chosen once when the task is built (``batch_format``), not by the keys a batch
    holds. A batch stays a dict of arrays (what the trainer splits into micro-batches, shards
    and stacks over trials); its format says which arrays it holds and how the model reads
    them. A split's arrays (``encode_sentences``'s) are shared by every format; a format that
    reads a frozen backbone's cached states reads their cache under ``CACHE`` besides them
    (the task's, which model_ready fills: NERTask.split)."""

    CACHE: ClassVar[str | None] = None  # the key of a split's state cache
    KEYS: ClassVar[tuple[str, ...]]  # what a training batch takes of the split's arrays

    @classmethod
    def new_cache(cls, arrays: dict):
        """An empty state cache of the split's sentences (None: a format without one)."""
        return None

    @staticmethod
    @abc.abstractmethod
    def logits(model, mb: dict, key, n_active: int):
        """The model's logits [B, P, C] on a micro-batch of this format."""

    @classmethod
    @abc.abstractmethod
    def predict(cls, models: Models, arrays: dict, batch: int,
                n_active: int | None) -> list[np.ndarray]:
        """Greedy label ids [n, P] of every sentence of a split, per model; n_active: the
        slot bound for token batches (eval_active), by default the split's own."""

    @classmethod
    def source(cls, train: dict, *, accum: int, per_micro: int, **where):
        """The grain source of training batches (where: ExampleBatchSource's global_batch,
        seed, process_index, process_count); accum, per_micro: micro-batches per step and
        the word slots one process packs for each (WordStateBatches)."""
        return ExampleBatchSource({k: train[k] for k in cls.KEYS}, **where)


class TokenBatches(NERBatches):
    """Word pieces: the backbone runs in every step (fusion.mode ft, or fe without
    fusion.cache), a method that reads words at the slots in use alone (n_active)."""

    KEYS = ("tokens", "segments", "mask", "positions", "labels")

    @staticmethod
    def logits(model, mb, key, n_active):
        return model(mb["tokens"], mb["segments"], mb["mask"], mb["positions"], key=key,
                     n_active=n_active)

    @classmethod
    def predict(cls, models, arrays, batch, n_active):
        if n_active is None:
            n_active = eval_active([arrays], batch)
        return _predict_rows(models, arrays, batch, ("tokens", "segments", "mask", "positions"),
                             _predict, n_active)


class SentenceStateBatches(NERBatches):
    """The frozen backbone's last-layer states of each sentence, [T, D] (a method that reads
    the sentence: Base+n), cached once (state_cache.StateCache)."""

    CACHE = "states"
    KEYS = ("states", "mask", "positions", "labels")

    @classmethod
    def new_cache(cls, arrays):
        return state_cache.StateCache(len(arrays["tokens"]))

    @staticmethod
    def logits(model, mb, key, n_active):
        return model.logits_from_states(mb["states"], mb["mask"], mb["positions"], key=key)

    @classmethod
    def predict(cls, models, arrays, batch, n_active):
        return _predict_rows(models, arrays, batch, ("states", "mask", "positions"),
                             _predict_from_states)


class WordStateBatches(NERBatches):
    """The frozen backbone's states of the words in use alone, [L, D] each (a method that
    reads words), cached once (state_cache.WordCache) and packed per micro-batch as
    ``FusedModel.__call__`` packs them: a batch's "words" and "slots" besides the arrays of
    its sentences."""

    CACHE = "words"
    KEYS = ("mask", "positions", "labels")

    @classmethod
    def new_cache(cls, arrays):
        return state_cache.WordCache(arrays["positions"])

    @staticmethod
    def logits(model, mb, key, n_active):
        return model.logits_from_words(mb["words"], mb["slots"], mb["positions"], key=key)

    @classmethod
    def predict(cls, models, arrays, batch, n_active):
        """From the split's packed word states, EVAL_WORDS words per call (a word's logits
        depend on its states alone; the slots not in use get 0)."""
        cache = arrays[cls.CACHE]
        W = int(cache.offsets[-1])
        pred_W = [np.zeros(W, np.int32) for _ in range(len(models))]
        for i in range(0, W, EVAL_WORDS):
            chunk = cache.array[i:i + EVAL_WORDS]
            pad = np.zeros((EVAL_WORDS - len(chunk), *chunk.shape[1:]), chunk.dtype)
            for k, p in enumerate(models(_predict_words, np.concatenate([chunk, pad]))):
                pred_W[k][i:i + len(chunk)] = np.asarray(p)[:len(chunk)]
        rows = np.repeat(np.arange(cache.n), np.diff(cache.offsets))
        preds = []
        for p_W in pred_W:
            pred = np.zeros((cache.n, cache.width), np.int32)
            pred[rows, cache.slot] = p_W
            preds.append(pred)
        return preds

    @classmethod
    def source(cls, train, *, accum, per_micro, **where):
        return state_cache.PackedBatchSource({k: train[k] for k in cls.KEYS}, train[cls.CACHE],
                                             accum=accum, per_micro=per_micro, **where)


# The cached format of each kind of states a fusion method reads (models/fusions/: INPUT)
_CACHED = {Words: WordStateBatches, Sentence: SentenceStateBatches}


def batch_format(method: type[FusionMethod], cached: bool) -> type[NERBatches]:
    """The batches of an NER run with fusion method `method`: word pieces, or with the frozen
    backbone's states cached (cached), the states the method reads."""
    return _CACHED[method.INPUT] if cached else TokenBatches


def slots_in_use(arrays: dict) -> np.ndarray:
    """Word slots each sentence uses (positions > 0: the words that fit)."""
    return (np.asarray(arrays["positions"]) > 0).sum(1)


def train_active_bound(slots: np.ndarray, rows: int, batch: int | None = None) -> int:
    """The most word slots in use in any `rows` sentences of one batch of `batch` (default
    `rows`; a micro-batch, or a process's share, is a part of a batch) drawn from a split
    whose sentences use `slots` each. Batches are `batch` consecutive rows of a stream that
    visits the split epoch by epoch: when `batch` divides the split's size no batch straddles
    two epochs and a sentence appears at most once; otherwise up to ceil(batch / n) + 1 times."""
    n, batch = len(slots), batch or rows
    times = 1 if n % batch == 0 else -(-batch // n) + 1
    return int(max(1, np.sort(np.repeat(slots, times))[::-1][:rows].sum()))


_DRAWN_LIMIT = 1 << 24  # rows: past this, the bound over every possible batch is used


def drawn_active_bounds(slots: np.ndarray, *, seed: int, steps: int, batch: int, accum: int,
                        processes: int) -> tuple[int, int] | None:
    """(most slots in use in any micro-batch, and in any process's part of one) over the
    batches a run of `steps` steps actually draws: batch i's rows are rows i*batch.. of the
    seeded epoch-by-epoch stream (data/corpus/pipeline.py), so the bound is exact rather than the
    worst case of train_active_bound, which one long sentence makes ~3x the typical batch
    (WikiAnn 64-shot: 448 against ~130). None when the run is too long to list its rows."""
    n, total = len(slots), steps * batch
    if total > _DRAWN_LIMIT or not total:
        return None
    used = np.asarray(slots)[sample_ids(seed, n, 0, total)].reshape(steps, batch)
    b = np.arange(batch)
    micro, proc = b % accum, b // (batch // processes)
    whole = max(int(used[:, micro == m].sum(1).max()) for m in range(accum))
    part = max(int(used[:, (micro == m) & (proc == p)].sum(1).max())
               for m in range(accum) for p in range(processes))
    return max(whole, 1), max(part, 1)


def eval_active_bound(slots: np.ndarray, batch: int) -> int:
    """The most word slots in use in predict_tags' batches of a split (in order, the last
    padded with copies of its last sentence)."""
    pad = -len(slots) % batch
    padded = np.concatenate([slots, np.repeat(slots[-1:], pad)])
    return int(max(1, padded.reshape(-1, batch).sum(1).max()))


def compile_size(n_active: int, slots_per_batch: int, step: int = 64) -> int:
    """n_active rounded up to a multiple of `step` (at most every slot of a batch): runs whose
    bounds differ a little (an experiment's units) share compiled programs."""
    return min(slots_per_batch, -(-n_active // step) * step)


def eval_active(splits: list[dict], batch: int) -> int:
    """One slot bound (compile_size) for predict_tags on every split given: one compilation."""
    return max(compile_size(eval_active_bound(slots_in_use(a), batch),
                            batch * a["positions"].shape[1]) for a in splits)


def predict_tags(model, arrays: dict, n_words, labels, batch: int) -> list[list[str]]:
    """Greedy tags of every sentence by one model, from a split's word pieces."""
    pred = TokenBatches.predict(Models(model), arrays, batch, None)[0]
    return ner_sentences.decode_tags(pred, arrays["labels"], n_words, labels)


def _max_words(splits, seq_len: int) -> int:
    longest = max(len(s.tokens) for sents in splits for s in sents)
    return max(1, min(seq_len - 2, -(-longest // 8) * 8))


@dataclass(frozen=True)
class NERPrepared:
    """What an NER run reads before training: the sentences of each split (the few-shot sample
    for train), the backbone's word pieces, each split's arrays ([N, T] pieces, [N, P] word
    slots), the words per split that did not fit data.seq_len, and the compiled sizes: word
    slots in use per training micro-batch (all of the batch's rows, and a process's; a run's
    trials may raise them, NERTask.share_shapes), evaluation batch and slots. Never changed
    once read: the fe state caches are the task's (model_ready computes them)."""

    sentences: dict[str, list]
    words: Any
    arrays: dict[str, dict]
    dropped: dict[str, int]
    train_active: int
    words_per_micro: int
    eval_batch: int
    eval_active: Any


class NERTask(FusionTask):
    """Few-shot NER through a fusion module; best dev F1 over training and test F1 there."""
    RUNS = FusionNER

    prepared: NERPrepared

    def __init__(self, cfg: Config):
        super().__init__(cfg)
        self.labels = ner_sentences.ner_labels(cfg.task.dir)
        self.n_labels = len(self.labels)
        frozen = cfg.fusion.frozen_backbone  # its states never change
        self.batches = batch_format(self.fusion_method, frozen and cfg.fusion.cache)
        # with the cache a step never runs the backbone (its FLOPs, models/fused.py)
        self.step_flops = {"cached_backbone": self.batches.CACHE is not None}

    def read_data(self, run_dir: Path, primary: bool, barrier) -> NERPrepared:
        cfg, t = self.cfg, self.cfg.task
        train = pool = ner_sentences.read_split(t.dir, "train")
        if t.n_shot:
            train = ner_sentences.few_shot_sample(
                pool, t.n_shot, ner_sentences.n_classes(self.labels), seed=t.seed)
        sentences = {"train": train}
        for split in SPLITS:
            sents = ner_sentences.read_split(t.dir, split)
            sentences[split] = sents[:t.eval_max] if t.eval_max else sents
        words = backbone_words(cfg, run_dir, primary, barrier,
                               texts=lambda: [" ".join(s.tokens) for s in train])
        # word slots per sentence from the whole training split, not the few-shot sample:
        # runs that differ in their sample alone (trials of task.n_shot / task.seed) have the
        # same shapes and, drawn per slot of [B, P] (models/fused.py), the same dropout masks
        P = _max_words([pool, *sentences.values()], cfg.data.seq_len)
        arrays, dropped = {}, {}
        for split, sents in sentences.items():
            arrays[split], dropped[split] = ner_sentences.encode_sentences(
                sents, words.word_ids, self.labels, seq_len=cfg.data.seq_len, max_words=P,
                cls_id=words.cls_id, sep_id=words.sep_id, pad_id=words.pad_id)
            if dropped[split]:
                log.warning("NER %s: %d words do not fit in data.seq_len=%d and are scored as O",
                            split, dropped[split], cfg.data.seq_len)
        rows = cfg.data.batch_size // cfg.optim.accum_steps  # one micro-batch
        used = slots_in_use(arrays["train"])
        local = rows // jax.process_count()  # a process packs its own rows (WordCache.pack)
        drawn = drawn_active_bounds(used, seed=cfg.run.seed, steps=cfg.run.steps,
                                    batch=cfg.data.batch_size, accum=cfg.optim.accum_steps,
                                    processes=jax.process_count())
        whole, part = drawn or (train_active_bound(used, rows, cfg.data.batch_size),
                                train_active_bound(used, local, cfg.data.batch_size))
        eval_batch = cfg.task.eval_batch or cfg.data.batch_size
        return NERPrepared(
            sentences=sentences, words=words, arrays=arrays, dropped=dropped,
            train_active=compile_size(whole, rows * P),
            words_per_micro=compile_size(part, local * P),
            eval_batch=eval_batch, eval_active=eval_active([arrays[s] for s in SPLITS], eval_batch))

    def prepare(self, run_dir: Path, primary: bool, barrier) -> NERPrepared:
        prepared = super().prepare(run_dir, primary, barrier)
        # fe with fusion.cache: each split's state cache, filled by model_ready before the
        # first batch; the bounds on the word slots in use, which a run's trials share
        self.caches = {split: self.batches.new_cache(arrays)
                       for split, arrays in prepared.arrays.items()}
        self.train_active, self.words_per_micro = prepared.train_active, prepared.words_per_micro
        # Every process keeps the curve itself: only process 0 writes evals.jsonl, so another
        # process (another host) reading it at the end could see nothing or half of it. What
        # earlier invocations of a resumed run wrote is complete by now.
        self._read_curve()
        return prepared

    @staticmethod
    def share_shapes(tasks: list) -> None:
        """Trials (trainer/trials.py) stack their batches and run one compiled step: every
        trial takes the largest of their bounds on the word slots a micro-batch uses (its
        seed's batches and its sample set its own). A larger bound still bounds its own
        batches, and padding slots are dropped, so its numbers stay its solo run's."""
        active = max(t.train_active for t in tasks)
        per_micro = max(t.words_per_micro for t in tasks)
        for t in tasks:
            t.train_active, t.words_per_micro = active, per_micro

    def split(self, name: str) -> dict:
        """A split's arrays as its batch format reads them: with its state cache, if any."""
        arrays = self.prepared.arrays[name]
        return arrays if self.batches.CACHE is None else \
            {**arrays, self.batches.CACHE: self.caches[name]}

    def _read_curve(self) -> None:
        """The evaluation points evals.jsonl holds, the last record of a step winning (a
        resumed run's redone step)."""
        evals = self.run_dir / "evals.jsonl"
        lines = evals.read_text().splitlines() if evals.is_file() else []
        self.curve = {r["step"]: r for r in map(json.loads, filter(str.strip, lines))}

    def write_outputs_to(self, directory) -> None:
        super().write_outputs_to(directory)
        self._read_curve()  # a resumed trial's own curve

    def model_ready(self, model) -> None:
        """fe: the frozen backbone's states of every train, dev and test sentence, once."""
        if self.batches.CACHE is None:
            return
        spec = state_cache.row_spec(model, self.prepared.arrays["train"])
        size = sum(c.nbytes(spec) for c in self.caches.values())
        n = sum(len(a["tokens"]) for a in self.prepared.arrays.values())
        on_disk = size > self.cfg.fusion.cache_mib * 2**20  # cache_mib=0: always
        where = self.run_dir / "cache"
        if self.primary:
            place = (f"memory-mapped under {where}" if on_disk else "in memory")
            print(f"fusion.mode=fe: caching the frozen backbone's states of {n} sentences "
                  f"({size / 2**20:.1f} MiB, {place}; fusion.cache_mib="
                  f"{self.cfg.fusion.cache_mib})", flush=True)
        batch = self.cfg.task.eval_batch or self.cfg.data.batch_size
        reused, digest = [], state_cache.backbone_digest(model)
        for split, arrays in self.prepared.arrays.items():
            cache = self.caches[split]
            # the training split at the width the uncached step feeds the backbone, so that
            # training is the same bit for bit; the others (scored only) by length
            by_length = split != "train"
            path = where / f"{split}.process{jax.process_index()}.npy" if on_disk else None
            if state_cache.fill_or_reuse(cache, model, arrays, batch, spec, by_length, digest,
                                         path):
                reused.append(split)
        if reused and self.primary:
            print(f"fusion.mode=fe: the states of {', '.join(reused)} were computed by an "
                  f"earlier run or trial in this process (same backbone and sentences): "
                  f"reused, not stored again", flush=True)

    def dataset(self) -> grain.MapDataset:
        return grain.MapDataset.source(self.batches.source(
            self.split("train"), accum=self.cfg.optim.accum_steps,
            per_micro=self.words_per_micro, global_batch=self.cfg.data.batch_size,
            seed=self.cfg.run.seed, process_index=jax.process_index(),
            process_count=jax.process_count()))

    def objective(self):
        # not prepared (a benchmark feeding batches of its own): every word slot is in use
        return ner_objective(self.train_active if self.prepared else 0, self.batches)

    def evaluates_alike(self, tasks) -> bool:
        """The same dev and test sentences, and any cached states the same arrays (an
        in-memory cache is shared by trials with the same frozen backbone)."""
        cached = self.batches.CACHE is not None

        def alike(t, s: str) -> bool:
            return same_arrays(t.prepared.arrays[s], self.prepared.arrays[s]) and (
                not cached or t.caches[s].array is self.caches[s].array)
        p = self.prepared
        return all(t.batches is self.batches and t.prepared.eval_batch == p.eval_batch
                   and t.prepared.eval_active == p.eval_active
                   and all(alike(t, s) for s in SPLITS)
                   for t in tasks)

    def evaluate(self, models: Models, tasks, step: int, sharding, final: bool) -> list:
        """Dev and test F1 of each trial (tagged side by side, vmapped); each trial's task
        keeps its own curve and writes its own files."""
        p = self.prepared
        preds = {split: self.batches.predict(models, self.split(split), p.eval_batch,
                                             p.eval_active) for split in SPLITS}
        return [t.finish_evaluation({s: preds[s][k] for s in SPLITS}, step, final)
                for k, t in enumerate(tasks)]

    def finish_evaluation(self, pred: dict, step: int, final: bool) -> tuple[dict, str]:
        res = {}
        for split in SPLITS:
            sents = self.prepared.sentences[split]
            tags = ner_sentences.decode_tags(pred[split], self.prepared.arrays[split]["labels"],
                                             [len(s.tokens) for s in sents], self.labels)
            for k, v in entity_f1.f1([list(s.tags) for s in sents], tags).items():
                res[f"{split}_{k}"] = v
        if self.primary:
            with open(self.run_dir / "evals.jsonl", "a") as f:
                f.write(json.dumps({"step": step, **res}) + "\n")
        self.curve[step] = {"step": step, **res}  # a resumed run's redone step: the last wins
        if final:
            curve = [self.curve[s] for s in sorted(self.curve)]
            res.update(best_of(curve))
            if self.primary:
                out = self.run_dir / "analysis"
                out.mkdir(parents=True, exist_ok=True)
                (out / "ner.json").write_text(json.dumps(self.results_file(res, curve), indent=2))
        return res, f"dev F1 {res['dev_f1']:.4f}, test F1 {res['test_f1']:.4f}"

    def results_file(self, res: dict, curve: list[dict]) -> dict:
        c, t = self.cfg, self.cfg.task
        return {"task": "ner", "dir": t.dir, "n_shot": t.n_shot, "trial_seed": t.seed,
                "method": c.fusion.method, "mode": c.fusion.mode, "backbone": t.init_from,
                "train_sentences": len(self.prepared.sentences["train"]),
                "labels": list(self.labels),
                "words_not_fitting": self.prepared.dropped, **res, "curve": curve}

    def summary(self, model) -> dict:
        return {"task": "ner", "init_from": self.cfg.task.init_from, "init_step": self.init_step,
                "analysis": str(self.run_dir / "analysis" / "ner.json")}

    EVAL_READS = frozenset({"step", "out", "splits"})

    def evaluate_checkpoint(self, run: Path, request: EvalRequest) -> dict:
        """seqeval micro F1 of the checkpoint on dev and test (or --splits), with the tagged
        sentences as JSONL."""
        cfg, model, step, _, _ = load_checkpoint(run, request.step, 0, tokenizer=False)
        reader = NERTask(cfg)  # its data alone: one pass over each split, nothing cached
        data = reader.read_data(run, primary=False, barrier=lambda: None)  # never writes
        directory = Path(request.out) if request.out else run / "eval" / f"step{step}"
        res, tagged = {"run": str(run), "step": step}, {}
        for split in [s.strip() for s in (request.splits or "dev,test").split(",") if s.strip()]:
            if split not in data.sentences or split == "train":
                raise ConfigError(f"--splits: {split!r} is not one of dev, test")
            sents = data.sentences[split]
            pred = predict_tags(model, data.arrays[split], [len(x.tokens) for x in sents],
                                reader.labels, cfg.task.eval_batch or cfg.data.batch_size)
            res[split] = entity_f1.f1([list(x.tags) for x in sents], pred)
            tagged[split] = [{"tokens": list(x.tokens), "gold": list(x.tags), "prediction": p}
                             for x, p in zip(sents, pred)]
        with writing_result(res, directory):  # computed first: printed even if not written
            directory.mkdir(parents=True, exist_ok=True)
            for split, rows in tagged.items():
                with open(directory / f"{split}.jsonl", "w") as f:
                    f.writelines(json.dumps(r) + "\n" for r in rows)
            (directory / "ner.json").write_text(json.dumps(res, indent=2) + "\n")
        return res


def best_of(curve: list[dict]) -> dict:
    """Best dev F1 over training (earliest step on ties) and the test F1 at that point."""
    best = max(curve, key=lambda r: (r["dev_f1"], -r["step"]))
    return {"best_dev_f1": best["dev_f1"], "best_step": best["step"],
            "test_f1_at_best": best["test_f1"]}
