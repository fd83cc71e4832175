"""Trials: K runs that share every array shape, trained side by side as one compiled program.

A run with ``run.seeds`` or a ``trials`` list (trial_grid.trial_grid) has K trials, each exactly
the solo run its own config describes (trial_grid.trial_configs). Their train states are stacked on
a leading trial axis (``TrialState``), each initialised by one init program that takes the seed
as an argument, and the solo step's update (step.make_update) is vmapped over that axis and
jitted once. What varies between trials goes in as arrays: the seed (the key of the init and of
dropout), the settings that vary (``hparams``: the learning-rate schedule and weight decay are
built inside the vmapped step from them; dropout rates and ACT's ponder weight reach the model
through trial_tracing.setting), and each trial's batches (each trial has its own Task and so its own
data iterator: ``TrialIterator``). A trial whose loss, gradient or updated parameters turn
non-finite is frozen: its update is masked from then on and the others go on. The arrays
every trial holds alike and never trains (trial_task.py's trial_shared: a frozen pretrained
backbone) are kept once, outside the trial axis (``TrialState.shared``), and enter the
vmapped step and evaluation unbatched.

With several devices the trial axis is sharded over the mesh's data axis when the trials
divide over it (each device trains its own trials: no cross-device traffic); otherwise it is
replicated and each trial keeps the solo run's data/model sharding.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
from jaxtyping import Array

from ..config import Config
from ..trial_grid import TRIAL_FIELDS
from ..trial_tracing import DROPOUT_SETTINGS, SCALAR_SETTINGS, Keep, trial_values
from . import checkpoint as ckpt
from . import sharding as shd
from .optim import make_optimizer
from .step import TrainState, init_state, make_update, state_shardings, with_compile_check
from ..trial_axis import Models, select, shared_spec  # noqa: F401 (select: the trainer's)
from .task import Task

# Optimizer settings a trial may vary, as make_optimizer's keyword arguments.
OPTIM_HPARAMS = {"optim.lr": "lr", "optim.weight_decay": "weight_decay"}


class TrialState(eqx.Module):
    state: TrainState  # every leaf with a leading trial axis [K, ...]
    # float32[K] per varying setting: make_optimizer's keyword for an optimizer setting, the
    # setting's name for one a model reads (a dropout rate as its keep probability 1 - rate)
    hparams: dict
    frozen: Array  # bool[K]: trials stopped by a non-finite value; their updates are masked
    # the arrays every trial holds alike and never trains, once (no trial axis): a
    # model-shaped pytree holding them, None elsewhere (where `state.model` holds None);
    # None when the trials share nothing
    shared: Any = None

    @property
    def n_trials(self) -> int:
        return self.frozen.shape[0]

    @property
    def step(self) -> Array:
        """int32[K]: each trial's optimizer steps (the same in every trial)."""
        return self.state.step

    def models(self) -> Models:
        """The K trials' models, for an evaluation."""
        return Models(self.state.model, self.n_trials, self.shared)

    def trial(self, k: int) -> TrainState:
        """Trial k's state, as its solo run holds it."""
        one = select(self.state, k)
        return one if self.shared is None else _with_model(one, eqx.combine(one.model,
                                                                           self.shared))


def per_trial(state, batch) -> tuple[int, Any, dict]:
    """(K, the state's TrainState, one trial's batch) of a step's arguments, stacked or not:
    what a per-trial cost (trainer/memory.py) is computed from."""
    if isinstance(state, TrialState):
        return state.n_trials, state.state, {n: v[0] for n, v in batch.items()}
    return 1, state, batch


def trial_dir(run_dir: Path, k: int) -> Path:
    """Trial k's directory in a run with trials: its evaluations and analyses while training,
    and the single-trial run it is exported to (export.py)."""
    return Path(run_dir) / "trials" / str(k)


# Settings that change what a trial's task prepares (its sample of the data, splits a
# tokenizer may be trained on, the pretrained run its tokenizer comes from): such a trial
# prepares its data in its own directory.
DATA_SETTINGS = ("task.seed", "task.n_shot", "task.init_from", "data.tokenizer")


def _value(cfg: Config, setting: str):
    sec, name = setting.split(".")
    return getattr(getattr(cfg, sec), name)


def data_dir(run_dir: Path, cfgs: list[Config], k: int) -> Path:
    """Where trial k's task prepares its data: the run directory, shared with trial 0, unless
    its DATA_SETTINGS differ from trial 0's (then its own trial directory, as its solo run
    would prepare it)."""
    own = any(_value(cfgs[k], f) != _value(cfgs[0], f) for f in DATA_SETTINGS)
    return trial_dir(run_dir, k) if own else Path(run_dir)


def varying(cfgs: list[Config]) -> list[str]:
    """The settings (``section.field``) whose values differ between the trials (task.seed
    not, where it is every trial's run.seed)."""
    fields = [f for f, _ in TRIAL_FIELDS.values()] + ["run.seed"]
    if all(c.task.seed == c.run.seed for c in cfgs):  # trials.task_seed "seed": the seed's
        fields.remove("task.seed")
    return [f for f in fields if len({_value(c, f) for c in cfgs}) > 1]


def label(cfg: Config, fields: list[str]) -> str:
    """``run.seed=1, optim.lr=0.003``: what sets a trial apart, as messages name it."""
    return ", ".join(f"{f}={v}" for f, v in settings(cfg, fields).items())


def hparams(cfgs: list[Config]) -> dict[str, np.ndarray]:
    """float32[K] per varying setting the step reads (TrialState.hparams). A dropout rate is
    carried as 1 - rate, computed in float64 as a solo run's Python float is."""
    out = {}
    for f in varying(cfgs):
        values = np.asarray([_value(c, f) for c in cfgs], np.float64)
        if f in OPTIM_HPARAMS:
            out[OPTIM_HPARAMS[f]] = values.astype(np.float32)
        elif f in DROPOUT_SETTINGS:
            out[f] = (1.0 - values).astype(np.float32)
        elif f in SCALAR_SETTINGS:
            out[f] = values.astype(np.float32)
    return out


def trial_axis(mesh: Mesh, k: int) -> str | None:
    """The mesh axis the trial axis is sharded over: "data" when the K trials divide over
    more than one device of it (the model axis then stays within each trial), else None."""
    n = mesh.shape["data"]
    return "data" if n > 1 and k % n == 0 else None


def _stacked(sharding: NamedSharding, axis: str | None) -> NamedSharding:
    """A solo leaf's sharding with a leading trial axis; a trial axis over "data" takes that
    axis from the leaf (an FSDP-sharded parameter is then whole within its trial)."""
    inner = tuple(None if (a == axis or (isinstance(a, tuple) and axis in a)) else a
                  for a in sharding.spec) if axis else tuple(sharding.spec)
    return NamedSharding(sharding.mesh, P(axis, *inner))


def batch_sharding(mesh: Mesh, k: int) -> NamedSharding:
    """Stacked batches [K, B, ...]: over the trials, or each trial's rows over the data axis."""
    axis = trial_axis(mesh, k)
    return NamedSharding(mesh, P(axis) if axis else P(None, "data"))


def own_pretrained(cfgs: list[Config]) -> bool:
    """Whether each trial starts from its own pretrained run (task.init_from "...{seed}")."""
    return len({c.task.init_from for c in cfgs}) > 1


def _shared_spec(cfgs: list[Config], task: Task, model) -> Any:
    """Filter spec of the model's arrays that every trial shares (trial_task.py's
    SharesArrays, of the kinds that have such arrays), or None: never when the trials start
    from different pretrained runs."""
    shared = getattr(task, "trial_shared", None)
    if own_pretrained(cfgs) or shared is None:
        return None
    spec = shared(model)
    return spec if spec is not None and any(jax.tree.leaves(spec)) else None


def _with_model(state: TrainState, model) -> TrainState:
    return TrainState(state.step, model, state.opt_state, state.key)


def _split_model(state: TrainState, spec) -> tuple[TrainState, Any]:
    """(state with the shared arrays taken out of its model, the shared arrays)."""
    shared, own = eqx.partition(state.model, spec)
    return _with_model(state, own), shared


def trial_shardings(cfgs: list[Config], tx, mesh: Mesh, task: Task):
    """(abstract TrialState, matching pytree of NamedShardings)."""
    k, axis = len(cfgs), trial_axis(mesh, len(cfgs))
    abstract, solo = state_shardings(cfgs[0], tx, mesh, task)
    shared = shared_sh = None
    spec = _shared_spec(cfgs, task, abstract.model)
    if spec is not None:  # kept once, placed as a solo run places them
        abstract, shared = _split_model(abstract, spec)
        solo, shared_sh = _split_model(solo, spec)
    stacked = jax.tree.map(lambda a: jax.ShapeDtypeStruct((k, *a.shape), a.dtype), abstract)
    sh = jax.tree.map(lambda s: _stacked(s, axis), solo)
    hp = {n: jax.ShapeDtypeStruct((k,), jnp.float32) for n in hparams(cfgs)}
    vec = NamedSharding(mesh, P(axis))
    return (TrialState(stacked, hp, jax.ShapeDtypeStruct((k,), jnp.bool_), shared),
            TrialState(sh, {n: vec for n in hp}, vec, shared_sh))


def restore(mngr, step: int, abstract: TrialState, shardings: TrialState) -> TrialState:
    """checkpoint.restore of a run with trials. A checkpoint written before the shared arrays
    were kept once (jaxdepth up to commit ebc47d7: K stacked copies of a frozen backbone)
    has another tree: it is refused saying so, not converted."""
    try:
        return ckpt.restore(mngr, step, abstract, shardings)
    except Exception as e:
        # Orbax names the tree that differs; only the layout of `shared` is known to change
        if abstract.shared is None or "do not match" not in str(e) or "shared" not in str(e):
            raise
        raise ValueError("written before the trials kept their frozen backbone once (it holds "
                         "a copy per trial): resume or export it with jaxdepth at commit "
                         "ebc47d7 or earlier") from None


def one_abstract_model(abstract: TrialState):
    """One trial's abstract model (ShapeDtypeStruct leaves), shared arrays included."""
    model = jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape[1:], a.dtype),
                         abstract.state.model)
    return model if abstract.shared is None else eqx.combine(model, abstract.shared)


def trials_init(cfgs: list[Config], tx, task: Task, shardings, pretrained=None) -> TrialState:
    """The K fresh states, each trial's weights those of a solo run of its seed, placed with
    `shardings`; `pretrained` (as step.sharded_init) enters every trial, or a list of them,
    trial k's the k-th. The arrays `shardings` keeps once (TrialState.shared) are trial 0's:
    every trial's are the same pretrained arrays.

    One init program with the seed as an argument, called once per trial, then stacked: the
    same weights as one filter_vmap over the seeds (the seed is traced either way), but a
    vmapped random init compiled about 3x slower on the CPU (12 s against 4 s for tiny-L2 at
    K=4), the largest fixed cost of a small trials unit."""
    hp = {n: jnp.asarray(v) for n, v in hparams(cfgs).items()}
    per_trial = isinstance(pretrained, list)  # each trial's own weights (task.init_from {seed})
    given = [eqx.filter(p, eqx.is_array) for p in pretrained] if per_trial else (
        [None if pretrained is None else eqx.filter(pretrained, eqx.is_array)] * len(cfgs))
    one = eqx.filter_jit(lambda seed, g: init_state(cfgs[0], tx, task, g, seed=seed))
    states = [one(jnp.int32(c.run.seed), g) for c, g in zip(cfgs, given)]
    spec = None if shardings.shared is None else shared_spec(shardings.shared)

    @eqx.filter_jit
    def stack(states, hp):
        shared = None
        if spec is not None:
            states, shared = zip(*(_split_model(s, spec) for s in states))
            shared = shared[0]
        stacked = jax.tree.map(lambda *xs: jnp.stack(xs), *states)
        return eqx.filter_shard(TrialState(stacked, hp, jnp.zeros(len(states), jnp.bool_),
                                           shared), shardings)

    return stack(states, hp)


def _uses_dropout(task: Task) -> bool:
    """Whether the trial's own model (its task's, built abstractly) has dropout: the stacked
    step's model is trial 0's, whose static rate may be 0 where another trial's is not."""
    return eqx.filter_eval_shape(task.build_model, key=jax.random.key(0)).uses_dropout


def make_trials_step(cfgs: list[Config], mesh: Mesh, shardings, tasks: list[Task],
                     on_compile=None):
    """run(trial_state, stacked batch) -> (trial_state, metrics of [K] arrays, with "frozen").

    One jitted program: the solo update vmapped over the trials, each with its own optimizer
    settings; a trial that is frozen, or whose loss, gradient norm or updated parameters are
    not finite, keeps its state (and is frozen from then on). The state is donated. The
    objective is trial 0's task's; dropout keys are drawn when any trial's model has dropout
    (a trial at rate 0 then keeps every unit, as its solo run does without a key)."""
    cfg, task = cfgs[0], tasks[0]
    axis = trial_axis(mesh, len(cfgs))
    # within a trial, its rows over the data axis unless the trials took it
    update = make_update(cfg, task, None if axis else NamedSharding(mesh, P(None, "data")),
                         dropout=any(map(_uses_dropout, tasks)))

    def one(state: TrainState, batch, hp: dict, frozen, shared):
        mine = state  # this trial's own arrays
        if shared is not None:  # the trial's whole model; only its own arrays come back
            state = _with_model(state, eqx.combine(state.model, shared))
        tx = make_optimizer(cfg.optim, cfg.run.steps,
                            **{n: v for n, v in hp.items() if n in OPTIM_HPARAMS.values()})
        model_values = {n: Keep(v) if n in DROPOUT_SETTINGS else v
                        for n, v in hp.items() if n not in OPTIM_HPARAMS.values()}
        with trial_values(model_values):
            new, m = update(state, batch, tx)
        if shared is not None:  # never trained: the same arrays as went in
            new, _ = _split_model(new, shared_spec(shared))
        state = mine
        bad = ~(jnp.isfinite(m["loss"]) & jnp.isfinite(m["grad_norm"])
                & jnp.isfinite(m["param_norm"]))
        stop = frozen | bad
        kept = jax.tree.map(lambda n, o: jnp.where(stop, o, n),
                            eqx.filter(new, eqx.is_array), eqx.filter(state, eqx.is_array))
        new = eqx.combine(kept, new)
        new = TrainState(state.step + 1, new.model, new.opt_state, new.key)
        return new, {**m, "frozen": stop}

    @eqx.filter_jit(donate="all-except-first")
    def step(batch, ts: TrialState):
        states, m = jax.vmap(one, in_axes=(0, 0, 0, 0, None))(ts.state, batch, ts.hparams,
                                                              ts.frozen, ts.shared)
        new = TrialState(states, ts.hparams, m["frozen"], ts.shared)
        return eqx.filter_shard(new, shardings), m

    return with_compile_check(step, on_compile)


class TrialIterator:
    """The trials' data iterators as one: ``next`` stacks their batches on a leading trial
    axis; its state (checkpointed like any iterator's, as JSON bytes) is the list of theirs."""

    def __init__(self, iterators: list):
        self.iterators = iterators

    def __iter__(self):
        return self

    def __next__(self) -> dict:
        batches = [next(it) for it in self.iterators]
        return {k: np.stack([b[k] for b in batches]) for k in batches[0]}

    def get_state(self) -> bytes:
        states = [it.get_state() for it in self.iterators]
        # a grain dataset iterator's state is a dict; others' (a loader's) are JSON bytes
        states = [json.loads(s) if isinstance(s, bytes) else s for s in states]
        return json.dumps({"trials": states}, indent=4).encode()

    def set_state(self, state) -> None:
        if isinstance(state, (bytes, str)):
            state = json.loads(state)
        saved = state.get("trials") if isinstance(state, dict) else None
        if not isinstance(saved, list) or len(saved) != len(self.iterators):
            raise ValueError(f"the checkpoint's data state holds "
                             f"{len(saved) if isinstance(saved, list) else 'no'} trials' "
                             f"iterators, not {len(self.iterators)}")
        for it, s in zip(self.iterators, saved):
            it.set_state(s if isinstance(it.get_state(), dict) else json.dumps(s).encode())

    def start_prefetch(self) -> None:
        for it in self.iterators:
            if hasattr(it, "start_prefetch"):
                it.start_prefetch()

    def close(self) -> None:
        for it in self.iterators:
            if hasattr(it, "close"):
                it.close()



def settings(cfg: Config, fields: list[str]) -> dict:
    """{setting: value} of what sets this trial apart (run.seed always)."""
    return {f: _value(cfg, f) for f in ["run.seed"] + [f for f in fields if f != "run.seed"]}


def _mean_ci(entries: list[dict]) -> tuple[dict, dict]:
    """(mean, 95% t half-width) of each number every entry reports (no half-width for one)."""
    from ..analysis.exact_match import mean_ci95

    keys = [k for k, v in (entries[0].items() if entries else ())
            if isinstance(v, (int, float)) and not isinstance(v, bool) and k != "trial"
            and all(isinstance(t.get(k), (int, float)) for t in entries)]
    mean, ci95 = {}, {}
    for k in keys:
        values = [float(t[k]) for t in entries]
        if len(values) >= 2:
            mean[k], ci95[k] = mean_ci95(values)
        else:
            mean[k] = values[0]
    return mean, ci95


def aggregate(per_trial: list[dict]) -> dict:
    """summary.json's trial part: every trial's entry and, over the trials not frozen, the
    mean and the half-width of the 95% t interval of each number they all report: over all
    of them ("mean", "ci95") when only the seed varies, else per setting of the other trial
    fields ("groups": the seeds of each learning rate, say)."""
    live = [t for t in per_trial if not t["frozen"]]
    out = {"n_trials": len(per_trial), "n_frozen": len(per_trial) - len(live)}
    groups: dict[str, list[dict]] = {}
    for t in live:
        rest = {k: v for k, v in t["settings"].items() if k != "run.seed"}
        groups.setdefault(json.dumps(rest, sort_keys=True), []).append(t)
    if len(groups) <= 1:
        out["mean"], out["ci95"] = _mean_ci(live)
    else:
        out["groups"] = []
        for key, entries in groups.items():
            mean, ci95 = _mean_ci(entries)
            out["groups"].append({"settings": json.loads(key),
                                  "trials": [t["trial"] for t in entries],
                                  "mean": mean, "ci95": ci95})
    return {**out, "trials": per_trial}

