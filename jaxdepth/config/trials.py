"""The trial grid: the ``trials`` section (values of a setting tried side by side, as trials
of one compiled program, trainer/trials.py), the grid product of its lists and run.seeds
(``trial_grid``), the settings each trial sets for itself (``per_trial``), each trial's own
config (``trial_configs``) and the settings the trials' configs differ in (``varying``). A
``cfg`` here is a config.Config (this module is imported by config.py, so it names that class
only in prose)."""
from __future__ import annotations

import itertools
from dataclasses import dataclass

from ..errors import ConfigError
from ..fields import require, resumable


def parse_list(text: str, kind: type, name: str) -> list:
    """The values of a comma-separated list field ("" -> []); ConfigError naming the field.
    Integers may be given as inclusive ranges, "0-44" (45 seeds are not typed one by one)."""
    if not text.strip():
        return []
    try:
        values = [v for item in text.split(",") for v in _items(item.strip(), kind)]
    except ValueError:
        raise ConfigError(f"{name}: {text!r} is not a comma-separated list of "
                          f"{kind.__name__}s", field=name) from None
    require(len(set(values)) == len(values), name, f"repeats a value: {text!r}")
    return values


def _items(item: str, kind: type) -> list:
    lo, sep, hi = item.partition("-")
    if kind is int and sep and lo.isdigit() and hi.isdigit():
        if int(hi) < int(lo):
            raise ValueError(item)
        return list(range(int(lo), int(hi) + 1))
    return [kind(item)]


@dataclass(frozen=True)
class TrialsConfig:
    """Values of a setting tried side by side, as trials of one compiled program
    (trainer/trials.py): each field a comma-separated list for the setting it names. The
    trials are the grid product of these lists and run.seeds. Only settings that change no
    array shape can vary between trials. A list gives its setting (a learning rate for an
    optimizer other than the recipe's included); the setting given as well is refused."""
    lr: str = ""  # optim.lr
    weight_decay: str = ""  # optim.weight_decay
    # task.seed (few-shot sample, grammar splits); "seed": each trial's run.seed (a few-shot
    # trial t samples its sentences and initialises with seed t)
    task_seed: str = ""
    n_shot: str = ""  # task.n_shot (ner: the few-shot sample's size)
    dropout: str = ""  # model.dropout (the decoder's)
    act_dropout: str = ""  # act.dropout
    fusion_dropout: str = ""  # fusion.dropout (on h before the NER head)
    tau: str = ""  # act.tau (the ponder-cost weight)
    # How the trials are evaluated (trial_axis.py:Models): vmapped (one program over the
    # trials' stacked models, where they evaluate on the same inputs) | trial_by_trial (each
    # on its slice, sharing the solo programs) | auto: vmapped except on the CPU, where K
    # independent programs overlap and were measured faster (docs/benchmarks.md). The same
    # numbers either way (tests/trainer/test_trials.py).
    evaluation: str = resumable("auto")

    def __post_init__(self):
        require(self.evaluation in TRIAL_EVALUATIONS, "trials.evaluation",
                f"must be one of {', '.join(TRIAL_EVALUATIONS)}, got {self.evaluation!r}")
        for name, (_, kind) in TRIAL_FIELDS.items():
            if name == "task_seed" and self.task_seed == FOLLOWS_SEED:
                continue
            values = parse_list(getattr(self, name), kind, f"trials.{name}")
            require(all(v >= 0 for v in values), f"trials.{name}", "values must be >= 0")
            if name.endswith("dropout"):
                require(all(v < 1 for v in values), f"trials.{name}", "rates must be below 1")


FOLLOWS_SEED = "seed"  # trials.task_seed: each trial's task.seed is its run.seed
TRIAL_EVALUATIONS = ("auto", "vmapped", "trial_by_trial")  # trials.evaluation

# trials.<name> -> (the setting it varies, its type)
TRIAL_FIELDS = {"lr": ("optim.lr", float), "weight_decay": ("optim.weight_decay", float),
                "task_seed": ("task.seed", int), "n_shot": ("task.n_shot", int),
                "dropout": ("model.dropout", float), "act_dropout": ("act.dropout", float),
                "fusion_dropout": ("fusion.dropout", float), "tau": ("act.tau", float)}


# In task.init_from or data.tokenizer: replaced by each trial's run.seed (a solo run's own), so
# that trial k starts from the pretraining run of its own seed (runs/pre-s{seed}), and a trial's
# config run solo is that trial.
SEED_FIELD = "{seed}"


def trial_grid(cfg) -> list[dict]:
    """The trials of cfg, each as {setting: value} over the settings that vary: the grid
    product of the trials section's lists (in TRIAL_FIELDS order) and run.seeds, the seed
    varying fastest (so each setting's seeds are neighbours). [] for a run without trials."""
    axes = [(TRIAL_FIELDS[n][0], parse_list(getattr(cfg.trials, n), TRIAL_FIELDS[n][1],
                                            f"trials.{n}"))
            for n in TRIAL_FIELDS if getattr(cfg.trials, n)
            and not (n == "task_seed" and cfg.trials.task_seed == FOLLOWS_SEED)]
    seeds = parse_list(cfg.run.seeds, int, "run.seeds")
    if not axes and not seeds:
        return []
    axes.append(("run.seed", seeds or [cfg.run.seed]))
    grid = [dict(zip([f for f, _ in axes], combo))
            for combo in itertools.product(*[values for _, values in axes])]
    if cfg.trials.task_seed == FOLLOWS_SEED:
        grid = [{**t, "task.seed": t["run.seed"]} for t in grid]
    return grid


def per_trial(cfg) -> dict[str, str]:
    """The settings (``section.field``) that each trial of cfg sets for itself, each to the list
    that sets it (``{"optim.lr": "trials.lr", "run.seed": "run.seeds"}``): the value cfg holds
    for such a setting is no trial's. {} for a run without trials."""
    grid = trial_grid(cfg)
    if not grid:
        return {}
    lists = {**{f: f"trials.{n}" for n, (f, _) in TRIAL_FIELDS.items()}, "run.seed": "run.seeds"}
    # without run.seeds every trial keeps cfg's run.seed
    return {s: lists[s] for s in grid[0] if s != "run.seed" or cfg.run.seeds.strip()}


def optim_per_trial(cfg) -> frozenset[str]:
    return frozenset(s.split(".")[1] for s in per_trial(cfg) if s.startswith("optim."))


def setting_value(cfg, setting: str):
    """cfg's value of a ``section.field`` setting."""
    sec, name = setting.split(".")
    return getattr(getattr(cfg, sec), name)


def varying(cfgs: list) -> list[str]:
    """The settings (``section.field``) whose values differ between the trials' configs
    (task.seed not, where it is every trial's run.seed)."""
    fields = [f for f, _ in TRIAL_FIELDS.values()] + ["run.seed"]
    if all(c.task.seed == c.run.seed for c in cfgs):  # trials.task_seed "seed": the seed's
        fields.remove("task.seed")
    return [f for f in fields if len({setting_value(c, f) for c in cfgs}) > 1]


def own_pretrained(cfgs: list) -> bool:
    """Whether each trial starts from its own pretrained run (task.init_from "...{seed}")."""
    return len({c.task.init_from for c in cfgs}) > 1


def trial_configs(cfg) -> list:
    """One Config per trial of cfg (trial_grid): cfg with that trial's settings, as the solo
    run it equals. [cfg] for a run without trials ({seed} replaced by its run.seed); a
    one-trial grid is that solo run."""
    overrides = []
    for trial in trial_grid(cfg) or [{}]:
        o: dict[str, dict] = {"run": {"seeds": ""}, "trials": {n: "" for n in TRIAL_FIELDS}}
        for setting, value in trial.items():
            sec, name = setting.split(".")
            o.setdefault(sec, {})[name] = value
        seed = str(trial.get("run.seed", cfg.run.seed))
        for sec, name in (("task", "init_from"), ("data", "tokenizer")):
            value = getattr(getattr(cfg, sec), name)
            if SEED_FIELD in value:  # each trial starts from the run of its own seed
                o.setdefault(sec, {})[name] = value.replace(SEED_FIELD, seed)
        overrides.append(o)
    if len(overrides) == 1 and not trial_grid(cfg):  # a solo run: {seed} is its run.seed
        seeded = {sec: v for sec, v in overrides[0].items() if sec in ("task", "data")}
        return [cfg.overridden(seeded) if seeded else cfg]
    return [cfg.overridden(o) for o in overrides]
