"""The training loop: restore-or-init, jitted steps, periodic eval/checkpoint, metrics.

It knows no task: the model, data, objective, FLOPs and evaluation come from the Task
(trainer/task.py) that ``jaxdepth.tasks.task_for`` chose for the config."""
from __future__ import annotations

import contextlib
import json
import math
import os
import signal
import sys
import threading
import time
from pathlib import Path

import jax
import numpy as np
from jax.experimental import multihost_utils
from tqdm import tqdm

from ..config import Config, ConfigError, trial_configs
from ..data.corpus.pipeline import lm_iterator
from ..errors import Interrupted, RunFailed, warn, writing
from . import checkpoint as ckpt
from .mfu import device_peak_flops
from .memory import step_check
from .metrics import MetricsWriter, TrainingClock, training_figures
from .optim import make_optimizer, schedule
from .run_lock import run_lock
from .sharding import batch_sharding, make_mesh, to_global
from .step import make_train_step, sharded_init, state_shardings
from .task import Task
from . import trials as tr
from ..trial_axis import Models


class NonFiniteLossError(RunFailed):
    pass


# A run that is not learning, without any NaN: a warning (once) after this many steps in a row
# with a gradient norm of exactly 0, or (a run whose loss is a token NLL) with the loss within
# UNIFORM_TOLERANCE of ln(vocab_size), the loss of uniform predictions, after warm-up.
STUCK_STEPS = 20
UNIFORM_TOLERANCE = 1e-3
# ... or (a run from fresh weights) whose mean loss over the PROGRESS_WINDOW steps after warm-up
# is less than MIN_PROGRESS (relative) below its mean over its first PROGRESS_WINDOW steps: a
# fresh model at a working learning rate moves far more by then (tiny-L2 at its recipe's lr:
# the loss from 6.7 at step 1 to 3.0 at step 60, 55% down), one at lr 1e-12 0.01%. Runs from
# pretrained weights may start near their final loss, so they are not judged by it.
PROGRESS_WINDOW = 10
MIN_PROGRESS = 0.01


def barrier(name: str) -> None:
    if jax.process_count() > 1:
        multihost_utils.sync_global_devices(name)


class StopSignals:
    """SIGTERM (a cluster's preemption) and SIGINT (Ctrl-C) while training: the first asks the
    loop to stop after the step in progress and save it (``signum`` is then set); a second
    exits at once, without saving, by the signal's default action. Installed only on the main
    thread (the only one Python lets set handlers); the previous handlers come back on exit."""

    SIGNALS = (signal.SIGTERM, signal.SIGINT)

    def __init__(self) -> None:
        self.signum = 0
        self.finishing = False  # past the last step: the final evaluation and summary
        self._previous: dict = {}

    def __enter__(self) -> "StopSignals":
        if threading.current_thread() is threading.main_thread():
            for s in self.SIGNALS:
                self._previous[s] = signal.signal(s, self._handle)
        return self

    def __exit__(self, *exc) -> None:
        for s, previous in self._previous.items():
            # None: a handler not set from Python, which cannot be put back
            signal.signal(s, signal.SIG_DFL if previous is None else previous)
        self._previous.clear()

    def _handle(self, signum: int, frame) -> None:
        name = signal.Signals(signum).name
        if self.signum:
            print(f"{name} again: exiting at once, without saving", file=sys.stderr, flush=True)
            signal.signal(signum, signal.SIG_DFL)
            os.kill(os.getpid(), signum)
            return
        self.signum = signum
        if self.finishing:  # every step is trained and saved: only the evaluation is left
            print(f"{name}: the last step is trained and saved; finishing the final evaluation "
                  f"and summary.json (send it again to exit at once, without them: rerunning "
                  f"the same command then evaluates again)", file=sys.stderr, flush=True)
            return
        print(f"{name}: stopping after the current step, once its checkpoint is saved (send it "
              f"again to exit at once, without saving)", file=sys.stderr, flush=True)

    def agreed(self) -> int:
        """The signal that stops the run after this step (0: none). Several processes agree,
        since a signal may reach one host only: every process calls this at every step."""
        if jax.process_count() == 1:
            return self.signum
        return int(np.max(np.asarray(multihost_utils.process_allgather(np.int32(self.signum)))))


def restore_or_init(cfg: Config, tx, mesh, mngr, data_iter, task: Task, tasks=None):
    """The newest readable checkpoint in run_dir if there is one (newer unreadable ones are
    moved aside to checkpoints-corrupt/), else a fresh sharded state, holding the task's
    pretrained weights if it has any. Then the task sees the model (``model_ready``), and
    only then is the data iterator restored in place: restoring it starts reading batches,
    which may depend on the model (a frozen backbone's cached states).
    tasks: the trials' tasks (trainer/trials.py), when the run has trials; `task` is the
    first. Returns (state, state shardings, whether the model starts from fresh weights: no
    checkpoint, no pretrained weights)."""
    state, shardings, data_state, fresh = _model_state(cfg, tx, mesh, mngr, task, tasks)
    if tasks is None:
        task.model_ready(state.model)
    else:
        for k, t in enumerate(tasks):
            t.model_ready(state.models().one(k))
    if data_state is not None:
        data_iter.set_state(data_state)
    data_iter.start_prefetch()  # loader threads or workers start while the step compiles
    return state, shardings, fresh


def _model_state(cfg: Config, tx, mesh, mngr, task: Task, tasks=None):
    """(state, shardings, the data iterator's saved state or None for a fresh start, whether
    the model's weights are fresh)."""
    cfgs = None if tasks is None else [t.cfg for t in tasks]
    abstract, shardings = (state_shardings(cfg, tx, mesh, task) if cfgs is None
                           else tr.trial_shardings(cfgs, tx, mesh, task))
    if mngr.all_steps():
        def restore_one(step: int):
            ckpt.saved_config(mngr, step)  # a checkpoint is read whole: its config and data
            data_state = ckpt.read_data_state(mngr, step)  # state too, before anything moves
            state = (ckpt.restore(mngr, step, abstract, shardings) if cfgs is None
                     else tr.restore(mngr, step, abstract, shardings))
            ckpt.verify(mngr, step, state)
            return state, data_state

        where = Path(cfg.run.dir) / "checkpoints"  # as the user gave it, not Orbax's absolute path
        (state, data_state), step, skipped = ckpt.restore_newest(
            mngr, restore_one, where=where,
            advice=f"; move {where} aside (or give another --run.dir) to start afresh")
        if skipped:
            run_dir = Path(cfg.run.dir)
            if jax.process_index() == 0:
                for s, why in skipped:
                    dest = ckpt.move_aside(run_dir, s)
                    warn(f"checkpoint {s} in {run_dir / 'checkpoints'} is unreadable ({why}); "
                         f"moved to {dest}; resuming from step {step}")
            barrier("checkpoint_fallback")
            mngr.reload()  # forget the steps moved away (the next saves must not touch them)
        return state, shardings, data_state, False
    # pretrained weights, with this run's run-time options, or None
    if cfgs is None:
        pretrained = task.initial_model(mesh, abstract.model)
        state = sharded_init(cfg, tx, mesh, task, shardings, pretrained)
        return state, shardings, None, pretrained is None
    model = tr.one_abstract_model(abstract)
    if tr.own_pretrained(cfgs):
        pretrained = [t.initial_model(mesh, model) for t in tasks]
        fresh = all(p is None for p in pretrained)
    else:
        pretrained = task.initial_model(mesh, model)
        fresh = pretrained is None
    return tr.trials_init(cfgs, tx, task, shardings, pretrained), shardings, None, fresh


def train(cfg: Config, task: Task | list[Task]) -> dict:
    """Run (or resume) the training cfg describes, of the model and data `task` gives;
    returns the summary it writes. A run with trials (config.trial_configs gives several)
    takes one task per trial, built from its trial's config, in that order. The run directory is locked for the duration (process 0
    holds the lock for every process of a multi-process run).

    SIGTERM or SIGINT while training stops the run after the step in progress, with a
    checkpoint of that step: ``Interrupted`` (errors.py), and no summary.json, which stays the
    mark of a finished run. A run that fails before its first checkpoint leaves no empty
    checkpoints/ directory behind."""
    run_dir = Path(cfg.run.dir)
    primary = jax.process_index() == 0
    with run_lock(run_dir) if primary else contextlib.nullcontext():
        checkpoints = run_dir / "checkpoints"
        created = not checkpoints.exists()  # open_manager creates it
        try:
            return _train(cfg, task, run_dir, primary)
        except BaseException:
            if created and primary:
                with contextlib.suppress(OSError):
                    checkpoints.rmdir()  # only if empty: nothing was saved
            raise


def _train(cfg: Config, task, run_dir: Path, primary: bool) -> dict:
    cfgs = trial_configs(cfg)
    tasks = list(task) if isinstance(task, (list, tuple)) else [task]
    if len(tasks) != len(cfgs):
        raise ValueError(f"{len(cfgs)} trials need as many tasks, got {len(tasks)}")
    task, trials = tasks[0], (tasks if len(tasks) > 1 else None)
    n_trials = len(tasks)
    mngr = ckpt.open_manager(run_dir, cfg.run.keep)
    newest = ckpt.newest_config(mngr)
    if newest is not None:  # refuse an impossible resume before touching any file
        latest, saved = newest
        ckpt.check_compatible(saved, cfg, run_dir)
        if cfg.run.steps < latest:
            raise ConfigError(f"run.steps: {cfg.run.steps} is below step {latest} of the latest "
                              f"checkpoint in {run_dir / 'checkpoints'}; give --run.steps "
                              f"{latest} or more (as many re-evaluates it)", field="run.steps")
    mesh = make_mesh(cfg.mesh)
    micro = cfg.data.batch_size // cfg.optim.accum_steps
    if micro % mesh.shape["data"]:
        raise ConfigError(f"data.batch_size: micro-batches of {micro} sequences (batch "
                          f"{cfg.data.batch_size} / accum_steps {cfg.optim.accum_steps}) do not "
                          f"split over the {mesh.shape['data']} devices of the data axis")
    for k, t in enumerate(tasks):
        if trials is None:
            t.prepare(run_dir, primary, barrier=lambda: barrier("prepare_data"))
            continue
        out = tr.trial_dir(run_dir, k)  # its evaluations and analyses, and its own data
        if primary:  # when its sample of the data differs from trial 0's
            out.mkdir(parents=True, exist_ok=True)
        t.prepare(tr.data_dir(run_dir, cfgs, k), primary, barrier=lambda: barrier("prepare_data"))
        t.write_outputs_to(out)
    if trials is not None:  # their batches stack and their step is one program: same shapes
        task.share_shapes(tasks)
    tx = make_optimizer(cfgs[0].optim, cfg.run.steps)
    lr_at = [schedule(c.optim, cfg.run.steps) for c in cfgs]
    if trials is None:
        data_iter = lm_iterator(task.dataset())
    else:
        data_iter = tr.TrialIterator([lm_iterator(t.dataset()) for t in tasks])
    state, shardings, fresh = restore_or_init(cfgs[0], tx, mesh, mngr, data_iter, task,
                                              trials)
    model_of = ((lambda k: state.model) if trials is None
                else (lambda k: state.models().one(k)))
    start = int(np.asarray(state.step).flat[0])  # [K] with trials
    if primary:
        ckpt.write_config(run_dir, cfg)

    # the first call refuses a step that cannot fit the device or the process's memory
    if trials is None:
        step_fn = make_train_step(cfg, tx, mesh, shardings, task,
                                  on_compile=step_check(cfg, mesh))
        b_sharding = batch_sharding(mesh)
    else:
        step_fn = tr.make_trials_step(cfgs, mesh, shardings, tasks,
                                      on_compile=step_check(cfg, mesh))
        b_sharding = tr.batch_sharding(mesh, n_trials)
    eval_sharding = batch_sharding(mesh)
    fields = tr.varying(cfgs) if trials else []
    names = [tr.label(c, fields) for c in cfgs]  # "run.seed=1, optim.lr=0.003"
    frozen_seen: set[int] = set()  # trials whose freezing was reported
    frozen_logged: set[int] = set()  # ... and logged to metrics.jsonl
    writer = MetricsWriter(run_dir, enabled=primary)
    tokens_per_step = cfg.data.batch_size * cfg.data.seq_len * n_trials
    flops_per_token, n_params = task.flops_per_token(model_of(0)), task.param_count(model_of(0))
    peak, peak_source = device_peak_flops(cfg.model.compute_dtype)
    peak_total = peak * mesh.size

    end = cfg.run.steps if not cfg.run.stop_after else min(cfg.run.steps, start + cfg.run.stop_after)
    bar = tqdm(total=cfg.run.steps, initial=start, disable=not (primary and cfg.run.progress),
               unit="step", dynamic_ncols=True)
    # Throughput is timed from the first finished step of this invocation (so compilation is
    # excluded) to the latest one, on a clock that stops while evaluating. A step whose record
    # carries a rate is waited for as soon as it is dispatched, before the next is (timed):
    # where the CPU runs a step as it is dispatched, the record of step N comes after step N+1
    # ran, and a rate read then would count N+1 in the interval before it and in none after.
    clock = TrainingClock()
    last = {"time": clock.now(), "step": start}
    first = dict(last)
    stamps: dict[int, float] = {}  # the clock when each timed step was done

    def timed(step: int) -> bool:
        return step == start + 1 or step % cfg.run.log_every == 0 or step == end
    # This invocation's training figures; the end fills in what it did not measure (a
    # resumed run with fewer than two steps left) from metrics.jsonl.
    history: dict = {}
    checkpoints = run_dir / "checkpoints"  # as the user gave it (mngr.directory is absolute)
    # steps in a row with a gradient norm of 0 / a uniform-prediction loss; warnings given
    stuck = {"zero_grad": 0, "uniform": 0, "warned": set()}
    ln_vocab = math.log(cfg.vocab_size) if task.reports_perplexity else None
    warmup = cfg.optim.warmup_steps or 0
    # the losses of a fresh run's first PROGRESS_WINDOW steps and of the window after warm-up
    progress_at = max(warmup, PROGRESS_WINDOW) + PROGRESS_WINDOW if fresh and start == 0 else 0
    losses: dict[int, float] = {}

    def non_finite(step: int, m: dict) -> str | None:
        values = [("loss", m["loss"]), ("gradient norm", m["grad_norm"]),
                  ("parameter norm after the update", m["param_norm"])]
        bad = [f"{name} ({v})" for name, v in values if not math.isfinite(v)]
        if not bad:
            return None
        finite = [f"{name} {v}" for name, v in values if math.isfinite(v)]
        return (f"non-finite {' and '.join(bad)} at step {step}"
                f"{' (finite: ' + ', '.join(finite) + ')' if finite else ''}")

    def check_finite(step: int, rows: list[dict]) -> None:
        """A solo run stops at a non-finite value; a trial is frozen by the step (its
        update masked: trials.py), reported here once, and the run stops only when every
        trial is frozen."""
        def stop(why: str) -> None:
            good = mngr.latest_step()
            kept = (f"The last good checkpoint (step {good}) in {checkpoints} is intact."
                    if good is not None else "No checkpoint was saved yet.")
            raise NonFiniteLossError(f"{why}; stopping. {kept}")

        if trials is None:
            why = non_finite(step, rows[0])
            if why is not None:
                stop(why)
            return
        for k, m in enumerate(rows):
            if m["frozen"] and k not in frozen_seen:
                frozen_seen.add(k)
                why = non_finite(step, m) or "non-finite values"
                if len(frozen_seen) == n_trials:
                    stop(f"every trial is frozen (trial {k}, {names[k]}: {why})")
                warn(f"trial {k} ({names[k]}): {why}; frozen at its last finite state, the "
                     f"other trials go on")

    def watch(step: int, m: dict) -> None:
        """Warn once about a run that is not learning though every value is finite."""
        stuck["zero_grad"] = stuck["zero_grad"] + 1 if m["grad_norm"] == 0 else 0
        uniform = (ln_vocab is not None and step > warmup
                   and abs(m["loss"] - ln_vocab) <= UNIFORM_TOLERANCE)
        stuck["uniform"] = stuck["uniform"] + 1 if uniform else 0
        steps = f"steps {step - STUCK_STEPS + 1}-{step}"
        if stuck["zero_grad"] == STUCK_STEPS and "zero_grad" not in stuck["warned"]:
            stuck["warned"].add("zero_grad")
            warn(f"the gradient norm has been exactly 0 for {STUCK_STEPS} steps in a row "
                 f"({steps}): the parameters get no gradient; the run is not learning")
        if stuck["uniform"] == STUCK_STEPS and "uniform" not in stuck["warned"]:
            stuck["warned"].add("uniform")
            warn(f"the loss has stayed at ln(vocab_size) = ln {cfg.vocab_size} = "
                 f"{ln_vocab:.4f} (uniform predictions) for {STUCK_STEPS} steps in a row after "
                 f"warm-up ({steps}): the run is not learning")
        if step <= PROGRESS_WINDOW or step > progress_at - PROGRESS_WINDOW:
            losses[step] = m["loss"]
        if step == progress_at and not (stuck["zero_grad"] or stuck["uniform"]):
            # (a run the two detectors above are already watching is theirs to name)
            window = (progress_at - PROGRESS_WINDOW + 1, progress_at)
            before = float(np.mean([losses[s] for s in range(1, PROGRESS_WINDOW + 1)]))
            after = float(np.mean([losses[s] for s in range(window[0], window[1] + 1)]))
            drop = (before - after) / abs(before) if before else 0.0
            if drop < MIN_PROGRESS:
                warn(f"the mean loss over steps {window[0]}-{window[1]}, after warm-up, is "
                     f"{after:.4f}, {100 * drop:.2f}% below its mean over steps "
                     f"1-{PROGRESS_WINDOW} ({before:.4f}): a model trained from fresh weights "
                     f"should have moved further; the run is hardly learning (optim.lr "
                     f"{cfg.optim.lr:g}?)")

    def record(step: int, metrics) -> None:
        """Read a finished step's metrics (a sync point) and log them (one record per trial
        when the run has trials)."""
        host = jax.device_get(metrics)
        rows = [{k: float(np.asarray(v).reshape(-1)[i]) for k, v in host.items()}
                for i in range(n_trials)]
        check_finite(step, rows)
        live = [m for m in rows if not m.get("frozen")]
        m = rows[0] if trials is None else {
            k: float(np.mean([r[k] for r in live])) for k in rows[0]}
        if primary and trials is None:
            watch(step, m)
        history.update(train_loss=m["loss"])
        for k, r in enumerate(rows if trials is not None else []):
            trial_history[k].update(train_loss=r["loss"])
        now = stamps.pop(step, None)
        rates = {}
        if now is not None and step == start + 1:
            last.update(time=now, step=step)
            first.update(time=now, step=step)
        elif now is not None:
            tps = (step - last["step"]) * tokens_per_step / max(now - last["time"], 1e-9)
            rates = dict(tokens_per_s=tps, mfu=tps * flops_per_token / peak_total)
            last.update(time=now, step=step)
            avg = (step - first["step"]) * tokens_per_step / max(now - first["time"], 1e-9)
            history.update(tokens_per_s=avg, mfu=avg * flops_per_token / peak_total)
            bar.set_postfix(loss=f"{m['loss']:.3f}", tok_s=f"{tps:,.0f}")
        if step % cfg.run.log_every == 0 or step == end or step == start + 1:
            for k, r in enumerate(rows):
                if r.get("frozen"):  # logged once, as frozen: its later values mean nothing
                    if k in frozen_logged:
                        continue
                    frozen_logged.add(k)
                extra = {n: v for n, v in r.items()
                         if n not in ("loss", "grad_norm", "param_norm", "tokens")}
                ppl = {"ppl": math.exp(min(r["loss"], 80.0))} if task.reports_perplexity else {}
                trial = {} if trials is None else {"trial": k}
                writer.write(step, **trial, loss=r["loss"], **ppl, lr=float(lr_at[k](step - 1)),
                             grad_norm=r["grad_norm"], param_norm=r["param_norm"], **extra,
                             **rates)

    def run_eval(step: int, final: bool = False) -> None:
        """Each trial's evaluation by its own task (Task.evaluate: vmapped over the stacked
        model where the trials evaluate on the same inputs)."""
        jax.block_until_ready(state)  # the step in flight is training time: the clock runs
        with clock.paused():
            models = Models(state.model) if trials is None else state.models()
            results = task.evaluate(models, tasks, step, eval_sharding, final)
            for k, (ev, message) in enumerate(results):
                trial = {} if trials is None else {"trial": k}
                (history if trials is None else trial_history[k]).update(ev)
                writer.write(step, **trial, **{n: v for n, v in ev.items()
                                               if isinstance(v, (int, float))
                                               and not n.endswith("_tokens")})
                bar.write(f"step {step}: {'' if trials is None else f'trial {k}: '}{message}")

    trial_history: list[dict] = [{} for _ in tasks]  # each trial's train loss and evaluation
    pending = None
    saving = None  # step of the latest asynchronous save, watched for a failure
    stopped = None  # (step, signal) of a stop asked for by SIGTERM / SIGINT
    # the handlers are the run's only: restored after the summary, an error or a stop
    with StopSignals() as signals:
        try:
            for step in range(start + 1, end + 1):
                if saving is not None:  # a failed save stops the run where it is detected
                    try:
                        if ckpt.check_saves(mngr, saving, step - 1, where=checkpoints):
                            saving = None
                    except ckpt.CheckpointSaveFailed:
                        if pending is not None:  # log the last step taken
                            record(*pending)
                        raise
                batch = to_global(next(data_iter), b_sharding)
                state, metrics = step_fn(state, batch)
                if timed(step):
                    jax.block_until_ready(state)
                    stamps[step] = clock.now()
                if pending is not None:  # step N is dispatched; now read step N-1 without stalling
                    record(*pending)
                pending = (step, metrics)
                bar.update(1)
                # The last step of this invocation is saved too: a run stopped by run.stop_after
                # resumes from where it stopped; so is a step a signal stops the run at.
                stop = signals.agreed()  # every process, every step: they stop at the same one
                if step % cfg.run.save_every == 0 or step == end or stop:
                    record(*pending)  # never checkpoint a state whose loss was not finite
                    pending = None
                    if saving is not None:
                        ckpt.check_saves(mngr, saving, step, wait=True, where=checkpoints)
                    ckpt.save(mngr, step, state, data_iter, cfg)
                    saving = step
                if step % cfg.run.eval_every == 0 and step != cfg.run.steps:
                    run_eval(step)  # also before a stop: the resumed run's metrics lack no step
                if stop and step < end:
                    ckpt.check_saves(mngr, saving, step, wait=True, where=checkpoints)
                    saving, stopped = None, (step, stop)
                    break
            if pending is not None:
                record(*pending)
            if saving is not None:
                ckpt.check_saves(mngr, saving, step, wait=True, where=checkpoints)
        except BaseException:
            bar.close()
            # Let a pending save of a good state commit; the error in flight is the one to report.
            with contextlib.suppress(Exception):
                mngr.wait_until_finished()
            raise
        bar.close()
        if stopped is not None:
            writer.close()
            mngr.close()
            step, signum = stopped
            raise Interrupted(f"stopped at step {step} by {signal.Signals(signum).name}: "
                              f"checkpoint of step {step} saved; rerun the same command to "
                              f"resume")

        # A signal from here on lets the run finish: it is trained and saved (StopSignals).
        signals.finishing = True
        final_step = int(np.asarray(state.step).flat[0])
        summary = {"step": final_step, "done": final_step >= cfg.run.steps}
        if final_step >= cfg.run.steps:
            run_eval(final_step, final=True)
            if primary:
                measured = training_figures(run_dir / "metrics.jsonl", final_step,
                                            tokens_per_step)
                if "tokens_per_s" in measured:
                    measured["mfu"] = measured["tokens_per_s"] * flops_per_token / peak_total
                history = {**measured, **history}
            summary.update(history)
            summary.update(params=n_params, flops_per_token=flops_per_token,
                           peak_flops=peak, peak_source=peak_source, devices=mesh.size)
            if trials is None:
                summary.update(task.summary(state.model))
            else:
                summary.pop("train_loss", None)
                frozen = np.asarray(jax.device_get(state.frozen))
                per_trial = [{"trial": k, "settings": tr.settings(cfgs[k], fields),
                              "frozen": bool(frozen[k]), **trial_history[k],
                              **t.summary(model_of(k))} for k, t in enumerate(tasks)]
                summary.update(tr.aggregate(per_trial), evaluation=(
                    "vmapped" if task.vmaps_evaluation(tasks) else "trial by trial"))
        summary.update(run_dir=str(run_dir), checkpoints=str(run_dir / "checkpoints"),
                       metrics=str(run_dir / "metrics.jsonl"), tensorboard=str(run_dir / "tb"))
        if primary and summary["done"]:
            with writing(run_dir / "summary.json"):
                (run_dir / "summary.json").write_text(json.dumps(summary, indent=2))
    writer.close()
    mngr.close()
    return summary

