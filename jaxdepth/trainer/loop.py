"""The training loop: restore-or-init, jitted steps, and the hooks around them (hooks.py:
metrics, throughput, checkpoints, evaluations; watchers.py: non-finite and stuck runs;
signals.py: SIGTERM and Ctrl-C).

It knows no task: the model, data, objective, FLOPs and evaluation come from the Task
(trainer/task.py) that ``jaxdepth.tasks.task_for`` chose for the config, one per trial. Every
run is K >= 1 trials (trials.py's ``Trials``); a run without trials is K = 1."""
from __future__ import annotations

import contextlib
import json
import math
import signal
from dataclasses import dataclass
from pathlib import Path

import jax
import numpy as np
from tqdm import tqdm

from ..config import Config, ConfigError
from ..config.trials import trial_configs
from ..errors import Interrupted
from ..files import write_whole
from . import checkpoint as ckpt, restore as rs
from .hooks import Checkpoints, Evaluations, Records, Throughput
from .memory import step_check
from .metrics import MetricsWriter, device_peak_flops, training_figures
from ..optim import make_optimizer, schedule
from .processes import barrier, check_shared_dir
from .run_lock import run_lock
from .sharding import batch_sharding, make_mesh, to_global
from .signals import StopSignals
from .task import Task
from .trials import Trials
from .watchers import NonFinite, Stuck


def restore_or_init(trials: Trials, tx, mngr, data_iter):
    """The newest readable checkpoint in the run directory if there is one (newer unreadable
    ones are moved aside to checkpoints-corrupt/), else a fresh sharded state, holding the
    tasks' pretrained weights if they have any. Then each task sees its model
    (``model_ready``), and only then is the data iterator restored in place: restoring it
    starts reading batches, which may depend on the model (a frozen backbone's cached
    states). Returns (state, state shardings, whether the weights are fresh: no checkpoint,
    no pretrained weights)."""
    abstract, shardings = trials.shardings(tx)
    if mngr.all_steps():
        state, data_state = rs.resume(mngr, Path(trials.cfgs[0].run.dir), abstract,
                                      shardings)
        fresh = False
    else:
        (state, fresh), data_state = trials.init(tx, abstract, shardings), None
    trials.tasks[0].share_start(trials.tasks)  # the pretrained step only trial 0 read
    models = state.models()
    for k, t in enumerate(trials.tasks):
        t.model_ready(models.one(k))
    if data_state is not None:
        data_iter.set_states(rs.data_states(data_state, trials.k))
    data_iter.start_prefetch()  # loader threads or workers start while the step compiles
    return state, shardings, fresh


def train(cfg: Config, task: Task | list[Task]) -> dict:
    """Run (or resume) the training cfg describes, of the model and data `task` gives;
    returns the summary it writes. A run with trials (config.trials.trial_configs gives several)
    takes one task per trial, built from its trial's config, in that order. The run directory
    is locked for the duration (process 0 holds the lock for every process of a
    multi-process run).

    SIGTERM or SIGINT while training stops the run after the step in progress, with a
    checkpoint of that step: ``Interrupted`` (errors.py), and no summary.json, which stays the
    mark of a finished run. A run that fails before its first checkpoint leaves no empty
    checkpoints/ directory behind."""
    run_dir = Path(cfg.run.dir)
    primary = jax.process_index() == 0
    tasks = list(task) if isinstance(task, (list, tuple)) else [task]
    with run_lock(run_dir) if primary else contextlib.nullcontext():
        check_shared_dir(run_dir)  # every process sees process 0's run directory
        checkpoints = run_dir / "checkpoints"
        created = not checkpoints.exists()  # open_manager creates it
        try:
            run = _start(cfg, tasks, run_dir, primary)
            with StopSignals() as signals:  # the run's only: restored after the summary
                try:
                    stopped = _steps(run, signals)
                finally:
                    run.bar.close()
                if stopped:
                    run.close()
                    raise Interrupted(stopped)
                signals.finishing = True  # (a run resumed at its last step: no step ran)
                summary = _finish(run)
            run.close()
            return summary
        except BaseException:
            if created and primary:
                with contextlib.suppress(OSError):
                    checkpoints.rmdir()  # only if empty: nothing was saved
            raise


@dataclass
class _Run:
    """What one invocation of a run holds while it trains: built by _start, read by the
    step loop and the end."""

    cfg: Config
    trials: Trials
    run_dir: Path
    primary: bool
    mngr: object
    state: object
    step_fn: object
    data_iter: object
    start: int
    end: int
    bar: object
    writer: MetricsWriter
    throughput: Throughput
    records: Records
    checkpoints: Checkpoints
    evaluations: Evaluations
    facts: dict  # params, flops_per_token, peak_flops, peak_source, devices

    def close(self) -> None:
        self.writer.close()
        self.mngr.close()


def _start(cfg: Config, tasks: list[Task], run_dir: Path, primary: bool) -> _Run:
    """Refuse an impossible resume, prepare every trial's data, restore or initialise the
    state, build the step and the hooks."""
    mngr = ckpt.open_manager(run_dir, cfg.run.keep)
    rs.check_resume(cfg, mngr, run_dir)
    mesh = make_mesh(cfg.mesh)
    micro = cfg.data.batch_size // cfg.optim.accum_steps
    if micro % mesh.shape["data"]:
        raise ConfigError(f"data.batch_size: micro-batches of {micro} sequences (batch "
                          f"{cfg.data.batch_size} / accum_steps {cfg.optim.accum_steps}) do not "
                          f"split over the {mesh.shape['data']} devices of the data axis")
    cfgs = trial_configs(cfg)
    trials = Trials(cfgs, tasks, mesh)
    trials.prepare(run_dir, primary, barrier=lambda: barrier("prepare_data"))
    tx = make_optimizer(cfgs[0].optim, cfg.run.steps)
    data_iter = trials.batches()
    state, shardings, fresh = restore_or_init(trials, tx, mngr, data_iter)
    start = int(np.asarray(state.step).flat[0])  # [K]: the same in every trial
    if primary:
        write_whole(run_dir / "config.json", cfg.to_json())
    # the first call refuses a step that cannot fit the device or the process's memory
    step_fn = trials.make_step(shardings, on_compile=step_check(cfg, mesh))
    end = cfg.run.steps if not cfg.run.stop_after else min(cfg.run.steps,
                                                            start + cfg.run.stop_after)
    # the hooks, each built from what it reads
    task, model = trials.tasks[0], state.models().one(0)
    # what the model answers for itself (models/declared.py), the step's share of it the task's
    flops_per_token = model.flops_per_token(cfg.data.seq_len, **task.step_flops)
    n_params = model.param_count()
    peak, peak_source = device_peak_flops(cfg.model.compute_dtype)
    bar = tqdm(total=cfg.run.steps, initial=start, disable=not (primary and cfg.run.progress),
               unit="step", dynamic_ncols=True)
    writer = MetricsWriter(run_dir, enabled=primary)
    throughput = Throughput(start, end, cfg.run.log_every,
                            cfg.data.batch_size * cfg.data.seq_len * trials.k,
                            flops_per_token, peak * mesh.size)
    checkpoints = run_dir / "checkpoints"  # as the user gave it (mngr.directory is absolute)
    ln_vocab = math.log(cfg.vocab_size) if task.reports_perplexity else None
    stuck = [Stuck(c, ln_vocab, fresh and start == 0, trials.named(k))
             for k, c in enumerate(trials.cfgs)] if primary else []
    records = Records(trials, writer, throughput, [NonFinite(trials, mngr, checkpoints)],
                      stuck, [schedule(c.optim, cfg.run.steps) for c in trials.cfgs],
                      task.reports_perplexity, bar)
    evaluations = Evaluations(trials, writer, records, throughput, batch_sharding(mesh), cfg,
                              bar)
    facts = dict(params=n_params, flops_per_token=flops_per_token, peak_flops=peak,
                 peak_source=peak_source, devices=mesh.size)
    return _Run(cfg, trials, run_dir, primary, mngr, state, step_fn, data_iter, start, end,
                bar, writer, throughput, records,
                Checkpoints(mngr, cfg, checkpoints, end), evaluations, facts)


def _steps(run: _Run, signals: StopSignals) -> str:
    """Train from run.start to run.end; "" when done, else the message of a stop asked by a
    signal (its step checkpointed)."""
    b_sharding = batch_sharding(run.trials.mesh, run.trials.k)
    records, saves = run.records, run.checkpoints
    try:
        for step in range(run.start + 1, run.end + 1):
            try:  # a failed save stops the run where it is detected
                saves.watch(step)
            except ckpt.CheckpointSaveFailed:
                records.flush()  # log the last step taken
                raise
            batch = to_global(next(run.data_iter), b_sharding)
            run.state, metrics = run.step_fn(run.state, batch)
            run.throughput.dispatched(step, run.state)
            records.dispatched(step, metrics)  # reads step - 1, now that step is dispatched
            run.bar.update(1)
            # The last step of this invocation is saved too: a run stopped by run.stop_after
            # resumes from where it stopped; so is a step a signal stops the run at.
            stop = signals.agreed()  # every process, every step: they stop at the same one
            if not stop and step == run.cfg.run.steps:
                signals.finishing = True  # trained: a signal from here on lets the run finish
            if saves.due(step, stop):
                records.flush()  # never checkpoint a state whose loss was not finite
                saves.save(step, run.state, run.data_iter)
            if run.evaluations.due(step):
                run.evaluations(step, run.state)  # also before a stop: no step goes unlogged
            if stop:  # (at the last step too: the signal came before it was checked)
                saves.wait(step)
                return (f"stopped at step {step} by {signal.Signals(stop).name}: checkpoint "
                        f"of step {step} saved; rerun the same command to resume")
        records.flush()
        saves.wait(run.end)
        return ""
    except BaseException:
        # Let a pending save of a good state commit; the error in flight is the one to report.
        with contextlib.suppress(Exception):
            run.mngr.wait_until_finished()
        raise


def _finish(run: _Run) -> dict:
    """The final evaluation and summary.json of a run trained to run.steps; a run stopped by
    run.stop_after short of it gets a summary that says so and writes none."""
    cfg, trials = run.cfg, run.trials
    final_step = int(np.asarray(run.state.step).flat[0])
    summary = {"step": final_step, "done": final_step >= cfg.run.steps}
    if summary["done"]:
        run.evaluations(final_step, run.state, final=True)
        measured = {}
        if run.primary:  # what this invocation did not measure, from metrics.jsonl
            measured = training_figures(run.run_dir / "metrics.jsonl", final_step,
                                        run.throughput.tokens_per_step)
            if "tokens_per_s" in measured:
                measured["mfu"] = run.throughput.mfu(measured["tokens_per_s"])
        models = run.state.models()
        summary.update(trials.summary(
            {**measured, **run.throughput.figures}, run.facts, run.records.history,
            [t.summary(models.one(k)) for k, t in enumerate(trials.tasks)],
            np.asarray(jax.device_get(run.state.frozen))))
    summary.update(run_dir=str(run.run_dir), checkpoints=str(run.run_dir / "checkpoints"),
                   metrics=str(run.run_dir / "metrics.jsonl"),
                   tensorboard=str(run.run_dir / "tb"))
    if run.primary and summary["done"]:
        write_whole(run.run_dir / "summary.json", json.dumps(summary, indent=2))
    return summary
