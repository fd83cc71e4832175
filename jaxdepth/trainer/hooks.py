"""What the training loop does around its steps, each a hook that owns its state: reading and
logging a step's metrics (``Records``, which hands each step's rows to the watchers of a run
going wrong, watchers.py, and times it with ``Throughput``), saving checkpoints
(``Checkpoints``) and evaluating (``Evaluations``). The loop (loop.py) only calls them in
order; signals.py stops it.
"""
from __future__ import annotations

import math
from pathlib import Path

import jax
import numpy as np

from . import checkpoint as ckpt
from .metrics import TrainingClock


class Throughput:
    """Tokens per second and MFU, timed from the first finished step of this invocation (so
    compilation is excluded) on a clock that stops while evaluating. A step whose record
    carries a rate is waited for as soon as it is dispatched, before the next one is: a rate
    read at its record would count the next step twice (docs/design.md §6, "Logging")."""

    def __init__(self, start: int, end: int, log_every: int, tokens_per_step: int,
                 flops_per_token: int, peak_total: float):
        self.start, self.end, self.log_every = start, end, log_every
        self.tokens_per_step, self.flops_per_token = tokens_per_step, flops_per_token
        self.peak_total = peak_total
        self.clock = TrainingClock()
        self.last = {"time": self.clock.now(), "step": start}
        self.first = dict(self.last)
        self.stamps: dict[int, float] = {}  # the clock when each timed step was done
        self.figures: dict = {}  # this invocation's tokens_per_s and mfu, once measured

    def timed(self, step: int) -> bool:
        return step == self.start + 1 or step % self.log_every == 0 or step == self.end

    def dispatched(self, step: int, state) -> None:
        if self.timed(step):
            jax.block_until_ready(state)
            self.stamps[step] = self.clock.now()

    def mfu(self, tokens_per_s: float) -> float:
        return tokens_per_s * self.flops_per_token / self.peak_total

    def rates(self, step: int) -> dict:
        """{tokens_per_s, mfu} since the last timed step, at a timed step after the first."""
        now = self.stamps.pop(step, None)
        if now is None:
            return {}
        if step == self.start + 1:
            self.last.update(time=now, step=step)
            self.first.update(time=now, step=step)
            return {}
        tps = (step - self.last["step"]) * self.tokens_per_step / max(now - self.last["time"],
                                                                     1e-9)
        self.last.update(time=now, step=step)
        avg = ((step - self.first["step"]) * self.tokens_per_step
               / max(now - self.first["time"], 1e-9))
        self.figures = dict(tokens_per_s=avg, mfu=self.mfu(avg))
        return dict(tokens_per_s=tps, mfu=self.mfu(tps))


class Records:
    """Reads each finished step's metrics (a sync point, one step behind the dispatch) and
    logs them: every log_every steps, the first and the last, one record per trial; a frozen
    trial once, at the record that finds it frozen (its later values mean nothing). The
    watchers see every step."""

    def __init__(self, trials, writer, throughput: Throughput, watchers: list,
                 stuck: list, lr_at: list, reports_perplexity: bool, bar):
        self.trials, self.writer, self.throughput = trials, writer, throughput
        self.watchers, self.stuck, self.lr_at = watchers, stuck, lr_at
        self.reports_perplexity, self.bar = reports_perplexity, bar
        self.history: list[dict] = [{} for _ in range(trials.k)]  # each trial's results
        self.frozen_logged: set[int] = set()
        self.pending = None  # (step, metrics) dispatched, not read yet

    def dispatched(self, step: int, metrics) -> None:
        """Step `step` is dispatched: read the one before it, which it no longer stalls."""
        self.flush()
        self.pending = (step, metrics)

    def flush(self) -> None:
        if self.pending is not None:
            pending, self.pending = self.pending, None
            self.record(*pending)

    def record(self, step: int, metrics) -> None:
        rows = self.trials.rows(metrics)
        for watch in self.watchers:
            watch(step, rows)
        for k, r in enumerate(rows):
            self.history[k].update(train_loss=r["loss"])
            # (a run of one reports no "frozen": NonFinite stops it at a non-finite value)
            if self.stuck and not r.get("frozen"):
                self.stuck[k](step, r)
        rates = self.throughput.rates(step)
        if rates:  # the bar shows the mean loss of the trials not frozen
            loss = np.mean([r["loss"] for r in rows if not r.get("frozen")])
            self.bar.set_postfix(loss=f"{loss:.3f}", tok_s=f"{rates['tokens_per_s']:,.0f}")
        if self.throughput.timed(step):
            for k, r in enumerate(rows):
                self._write(step, k, r, rates)

    def _write(self, step: int, k: int, r: dict, rates: dict) -> None:
        if r.get("frozen"):
            if k in self.frozen_logged:
                return
            self.frozen_logged.add(k)
        extra = {n: v for n, v in r.items()
                 if n not in ("loss", "grad_norm", "param_norm", "tokens")}
        ppl = {"ppl": math.exp(min(r["loss"], 80.0))} if self.reports_perplexity else {}
        self.writer.write(step, **self.trials.tag(k), loss=r["loss"], **ppl,
                          lr=float(self.lr_at[k](step - 1)), grad_norm=r["grad_norm"],
                          param_norm=r["param_norm"], **extra, **rates)


class Checkpoints:
    """Saves every save_every steps, at the last step of this invocation and at a stop
    asked by a signal, asynchronously; a failed save stops the run at the first step after
    it is detected, its previous checkpoint intact."""

    def __init__(self, mngr, cfg, checkpoints: Path, end: int):
        self.mngr, self.cfg, self.where, self.end = mngr, cfg, checkpoints, end
        self.saving = None  # step of the latest asynchronous save, watched for a failure

    def due(self, step: int, stop: int) -> bool:
        return step % self.cfg.run.save_every == 0 or step == self.end or bool(stop)

    def watch(self, step: int) -> None:
        """Before step `step`: raise CheckpointSaveFailed if the save in flight failed."""
        if self.saving is not None and ckpt.check_saves(self.mngr, self.saving, step - 1,
                                                        self.where):
            self.saving = None

    def save(self, step: int, state, data_iter) -> None:
        self.wait(step)
        ckpt.save(self.mngr, step, state, data_iter.states(), self.cfg)
        self.saving = step

    def wait(self, step: int) -> None:
        if self.saving is not None:
            ckpt.check_saves(self.mngr, self.saving, step, self.where, wait=True)
            self.saving = None


class Evaluations:
    """Each trial's evaluation by its own task (Trials.evaluate: vmapped over the stacked
    model where the trials evaluate on the same inputs), every eval_every steps but the last
    (the final evaluation is the summary's), logged, and kept in each trial's results. Its
    time is not training time: the throughput clock stops."""

    def __init__(self, trials, writer, records: Records, throughput: Throughput, sharding,
                 cfg, bar):
        self.trials, self.writer, self.records = trials, writer, records
        self.throughput, self.sharding, self.cfg, self.bar = throughput, sharding, cfg, bar

    def due(self, step: int) -> bool:
        return step % self.cfg.run.eval_every == 0 and step != self.cfg.run.steps

    def __call__(self, step: int, state, final: bool = False) -> None:
        jax.block_until_ready(state)  # the step in flight is training time: the clock runs
        with self.throughput.clock.paused():
            results = self.trials.evaluate(state, step, self.sharding, final)
            for k, (ev, message) in enumerate(results):
                self.records.history[k].update(ev)
                self.writer.write(step, **self.trials.tag(k), **{
                    n: v for n, v in ev.items()
                    if isinstance(v, (int, float)) and not n.endswith("_tokens")})
                self.bar.write(f"step {step}: {self.trials.prefix(k)}{message}")
