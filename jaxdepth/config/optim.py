"""The optim section: the optimizer, its schedule and the fields left to the run kind's recipe
(``RECIPE_FIELDS``)."""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

from . import run_kinds
from ..errors import ConfigError
from ..fields import check_reads, positive, require
from ..optim import OPTIMIZERS, OWN_FIELDS, SCHEDULES


# The optimizer fields a run kind's recipe sets (RunKind.RECIPE): left unset (None) in a
# config, they take the recipe of the run's kind, so a default tuned for one kind of run never
# changes another's (a standalone OptimConfig: LM pretraining's). OWN_FIELDS, which only some
# optimizers read, come per optimizer (the recipe's "moments", else the optimizer's DEFAULTS);
# one the optimizer does not read stays None (set, it is refused).
RECIPE_FIELDS = ("name", "lr", "schedule", "warmup_steps", "min_lr_ratio", "weight_decay",
                 "b1", "b2", "eps", "clip_norm")


@dataclass(frozen=True)
class OptimConfig:
    """The optimizer. Every field but accum_steps defaults to the run kind's recipe
    (RunKind.RECIPE; None here means "the recipe's"); a value given here is kept whatever the
    kind."""
    # one class each: jaxdepth/optim.py
    name: str = None
    lr: float = None  # adafactor: relative to each parameter's RMS
    # warmup, then the schedule's decay to lr * min_lr_ratio (one class each:
    # jaxdepth/optim.py)
    schedule: str = None
    warmup_steps: int = None  # steps of linear warmup from 0 to lr
    min_lr_ratio: float = None  # end of linear/cosine decay, as a fraction of lr
    weight_decay: float = None  # decoupled (AdamW/LAMB), never on norm scales and biases
    b1: float = None  # first-moment decay
    b2: float = None  # second-moment decay
    eps: float = None  # added to the root of the second moment
    clip_norm: float = None  # 0 disables global-norm clipping
    accum_steps: int = 1  # micro-batches per optimizer step
    # wsd: the share of run.steps (warmup included) that its final linear decay takes
    # (Hägele et al.'s 20% cooldown)
    decay_fraction: float = 0.2
    # The RECIPE_FIELDS that were left unset, filled from a recipe (Config refills them from
    # its run kind's). Not a setting: never saved, not compared.
    from_recipe: frozenset = field(default=frozenset(), init=False, repr=False, compare=False)

    def __post_init__(self):
        unset = frozenset(f for f in RECIPE_FIELDS if getattr(self, f) is None)
        recipe = run_kinds.default_recipe()  # a standalone OptimConfig: the default run's
        for f in unset - set(OWN_FIELDS):
            object.__setattr__(self, f, recipe[f])
        opt = OPTIMIZERS(self.name)  # a ConfigError naming optim.name
        unread = frozenset(OWN_FIELDS) - set(opt.DEFAULTS)
        # A field the optimizer does not read stays None, taken from no recipe; while the
        # optimizer is the recipe's, the run kind's may still change it (with_recipe).
        object.__setattr__(self, "from_recipe", unset if "name" in unset else unset - unread)
        for f in set(OWN_FIELDS) & set(opt.DEFAULTS) & unset:
            own = recipe["moments"].get(self.name, {})
            object.__setattr__(self, f, own.get(f, opt.DEFAULTS[f]))
        # A choice left to the recipe may still become the run kind's (with_recipe), which may
        # read what this one does not: only a choice made refuses a field it does not read.
        sched = SCHEDULES(self.schedule)  # a ConfigError naming optim.schedule
        for choice in ("name", "schedule"):
            if choice not in unset:
                check_reads(self, "optim", choice)
        positive(self, "optim", "lr", "accum_steps")
        require(self.warmup_steps >= 0, "optim.warmup_steps", "must be >= 0")
        sched.check(self)
        require(0.0 <= self.min_lr_ratio <= 1.0, "optim.min_lr_ratio", "must be in [0, 1]")
        require(self.clip_norm >= 0.0, "optim.clip_norm", "must be >= 0")

    def with_recipe(self, recipe: dict, kind: str,
                    per_trial: frozenset = frozenset()) -> "OptimConfig":
        """These settings, with the fields left unset taken from `recipe` (run kind `kind`'s).
        A recipe's learning rate belongs to its optimizer: naming another optimizer without a
        learning rate is refused rather than run at a rate meant for a different update rule,
        unless every trial gives its own (per_trial: the fields a trials list sets)."""
        if not self.from_recipe:
            return self
        if "lr" in self.from_recipe and "lr" not in per_trial and "name" not in self.from_recipe \
                and self.name != recipe["name"]:
            raise ConfigError(f"optim.lr: the {kind} recipe's learning rate {recipe['lr']} is "
                              f"for {recipe['name']}; with optim.name {self.name} give "
                              f"--optim.lr too", field="optim.lr")
        given = {f: getattr(self, f) for f in RECIPE_FIELDS if f not in self.from_recipe}
        name = given.get("name", recipe["name"])
        reads = OPTIMIZERS(name).DEFAULTS
        unread = [f for f in OWN_FIELDS if f in given and f not in reads]
        if unread and "name" not in given:  # the user set a moment, not this optimizer
            setting = f"optim.{unread[0]}"
            raise ConfigError(f"{setting}: the {kind} recipe's optimizer {name} does not read it "
                              f"(read by: {', '.join(OPTIMIZERS.readers(setting))}); name one "
                              f"that does with --optim.name", field=setting)
        own = recipe["moments"].get(name, {})
        taken = {**{f: own.get(f, default) for f, default in reads.items()},
                 **{f: v for f, v in recipe.items() if f != "moments"}}
        rest = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)
                if f.init and f.name not in RECIPE_FIELDS}  # accum_steps, declared fields
        out = OptimConfig(**{**taken, **given, **rest})
        object.__setattr__(out, "from_recipe", self.from_recipe)  # the kind may change again
        return out
