"""The train step is traced (and so compiled) exactly once per training run.

A second trace of the step in one run means every step after it pays for tracing and XLA
compilation again: typically the state or batch that comes back differs from the one that
went in (a weak type, a dtype, a sharding, a Python scalar where an array was), or a restored
or evaluated state is laid out differently from a fresh one. Timing cannot tell this reliably,
so the traces are counted: JAX reports every trace of a jitted function at top level as a
``/jax/core/compile/jaxpr_trace_duration`` monitoring event, and the test counts the events
that happen while the loop's step function is running. The loop gets its step function from
``Trials.make_step``, which the test wraps.

Runs (in-process, tiny models, 4 steps per invocation with an evaluation and a checkpoint after
the second): the decoder LM (tiny-L2 shrunk, as tests/trainer/test_training.py runs it), stopped with
``run.stop_after`` and resumed from its checkpoint, one trace in each invocation; and the ACT
encoder (``--preset act-tiny`` shrunk).
"""
from __future__ import annotations

import functools
import threading

import jax
import jax.numpy as jnp
import pytest

from _train_helpers import base_args, committed_steps, step_losses
from jaxdepth.config.cli import parse_args
from jaxdepth.tasks import task_for
from jaxdepth.trainer import loop
from jaxdepth.trainer.trials import Trials

TRACE_EVENT = "/jax/core/compile/jaxpr_trace_duration"
COMPILE_EVENT = "/jax/core/compile/backend_compile_duration"
# an evaluation and a checkpoint every 2 steps, every checkpoint kept
EVERY_2 = {"run.eval_every": 2, "run.save_every": 2, "run.keep": 4}


class TraceCounter:
    """Counts JAX traces and XLA compiles made while a watched function runs (in the thread
    that runs it: the checkpointer's background threads are not watched).

    JAX reports only top-level traces (one per trace of a jitted function, none for the jitted
    functions it calls), so the events inside a watched call are the traces of what it jits,
    plus one for each eager operation it dispatches for the first time in the process."""

    def __init__(self):
        self.traces: list[str] = []  # the traced function's name, one entry per trace
        self.compiled: list[str] = []  # the compiled program's name, one entry per compile
        self.calls = 0
        self._threads: set[int] = set()

    def _listener(self, event: str, duration: float, **kw) -> None:
        if threading.get_ident() not in self._threads:
            return
        if event == TRACE_EVENT:
            self.traces.append(kw.get("fun_name", "?"))
        elif event == COMPILE_EVENT:
            self.compiled.append(kw.get("fun_name", "?"))

    def watch(self, fn):
        @functools.wraps(fn)
        def watched(*args, **kwargs):
            self.calls += 1
            me = threading.get_ident()
            outer = me in self._threads
            self._threads.add(me)
            try:
                return fn(*args, **kwargs)
            finally:
                if not outer:
                    self._threads.discard(me)
        return watched

    def __enter__(self):
        jax.monitoring.register_event_duration_secs_listener(self._listener)
        return self

    def __exit__(self, *exc):
        jax.monitoring.unregister_event_duration_listener(self._listener)


def counted_train(cfg, monkeypatch) -> tuple[dict, TraceCounter]:
    """train(cfg) in this process, with the traces of its step function counted."""
    # Whatever the step callable dispatches besides its jitted step (a run of one: the
    # jitted take and put of its trial axis) then counts in every run, not only when it
    # happens to be first in the process.
    jax.clear_caches()
    counter = TraceCounter()
    make = Trials.make_step

    def make_counted(self, *args, **kwargs):
        return counter.watch(make(self, *args, **kwargs))

    with monkeypatch.context() as m, counter:
        m.setattr(Trials, "make_step", make_counted)
        summary = loop.train(cfg, task_for(cfg))
    return summary, counter


def assert_one_trace(counter: TraceCounter, steps: int) -> None:
    assert counter.calls == steps, f"the step ran {counter.calls} times, expected {steps}"
    traced = counter.traces
    assert "step" in traced and len(traced) == len(set(traced)), (
        f"the train step's functions were traced {len(traced)} times in one run ({traced}): "
        "the state or batch of a later step differs in type, shape, dtype or sharding from "
        "the first one's")
    # each program compiled at most once (not at all when the persistent cache serves it)
    assert len(counter.compiled) == len(set(counter.compiled)) <= len(traced), counter.compiled


def test_counter_counts_a_retraced_function():
    counter = TraceCounter()
    toy = counter.watch(jax.jit(lambda x: jnp.sin(x) * 2))
    with counter:
        toy(jnp.ones(3, jnp.float32))
        toy(jnp.zeros(3, jnp.float32))  # same shape and dtype: cached, no trace
        assert counter.traces == ["<lambda>"]
        toy(jnp.ones(5, jnp.float32))  # a new shape: traced again
        toy(1.0)  # a (weakly typed) Python scalar: again
        jax.jit(lambda x: x + 1)(jnp.ones(2))  # not watched: not counted
    toy(jnp.ones(7))  # after the context: not counted
    assert counter.traces == ["<lambda>"] * 3 and counter.calls == 5
    assert len(counter.compiled) <= 3  # (fewer if a persistent compilation cache serves some)


def _logged_and_saved(run_dir) -> tuple[list[int], list[int]]:
    """(training steps logged, steps checkpointed) of a run directory."""
    return sorted(step_losses(run_dir)), committed_steps(run_dir)


@pytest.mark.fake_devices
def test_decoder_lm_run_and_its_resumption_trace_the_step_once_each(tmp_path, tokenizer,
                                                                    monkeypatch):
    # 8 steps, evaluated and checkpointed every 2, stopped after 4 and resumed: each invocation
    # takes 4 steps with an evaluation and a checkpoint between them, and the second one starts
    # from a restored checkpoint. On a 4 x 2 data x model mesh, so that the state is sharded.
    argv = base_args(tmp_path, tokenizer, 8, **EVERY_2, **{"mesh.data": 4, "mesh.model": 2})
    first, counter = counted_train(parse_args(argv + ["--run.stop_after", "4"]), monkeypatch)
    assert not first["done"] and first["step"] == 4
    assert _logged_and_saved(tmp_path) == ([1, 2, 3, 4], [2, 4])
    assert_one_trace(counter, 4)

    second, counter = counted_train(parse_args(argv), monkeypatch)
    assert second["done"] and second["step"] == 8
    assert _logged_and_saved(tmp_path) == ([1, 2, 3, 4, 5, 6, 7, 8], [2, 4, 6, 8])
    assert_one_trace(counter, 4)


def test_act_encoder_run_traces_its_step_once(tmp_path, monkeypatch):
    over = {"act.vocab_size": 128, "act.d_model": 32, "act.n_heads": 2, "act.embed_dim": 16,
            "act.max_iters": 2, "act.max_len": 32, "data.seq_len": 32, "data.batch_size": 8,
            "data.grammar_docs": 300, "data.max_predictions": 5, "run.dir": tmp_path,
            "run.steps": 4, "run.log_every": 1, "run.progress": "false",
            "run.eval_batches": 1, "optim.warmup_steps": 1, "mesh.data": 1, "mesh.model": 1,
            **EVERY_2}
    argv = ["--preset", "act-tiny"]
    for k, v in over.items():
        argv += [f"--{k}", str(v)]
    cfg = parse_args(argv)
    assert cfg.model.arch == "act" and cfg.act.d_model == 32 and cfg.act.max_iters == 2
    summary, counter = counted_train(cfg, monkeypatch)
    assert summary["done"] and summary["step"] == 4
    assert _logged_and_saved(tmp_path) == ([1, 2, 3, 4], [2, 4])
    assert_one_trace(counter, 4)
