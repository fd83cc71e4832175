"""Fine-tuning an ALBERT-family encoder on a probing task of the embedded grammar
(task.name one of task_names.PROBE_TASKS)."""
from ...errors import ConfigError
from ..task_names import FUSION_TASKS, PROBE_TASKS
from . import FROM_PRETRAINED, GRAMMAR
from . import encoder_pretraining as pretraining


class ProbeFinetuning(pretraining.EncoderPretraining):
    # The paper fine-tunes with its pretraining's recipe (inherited), on the same encoder.
    NAME, ORDER = "probe", 2
    READS = (*GRAMMAR, *FROM_PRETRAINED, "task.n_train", "task.n_eval", "task.seed",
             "task.eval_batch")

    @classmethod
    def claims(cls, cfg) -> bool:  # an ALBERT-family encoder given a task that is not fusion's
        name = cfg.task.name
        return cfg.arch.FINETUNING == cls.NAME and bool(name) and name not in FUSION_TASKS

    @classmethod
    def check(cls, cfg) -> None:
        super().check(cfg)
        if cfg.task.name not in PROBE_TASKS:
            raise ConfigError(f"task.name: {cfg.task.name!r} is a decoder task; encoders "
                              f"(model.arch={cfg.model.arch!r}) fine-tune on "
                              f"{', '.join(PROBE_TASKS)}", field="task.name")

    @classmethod
    def options(cls, cfg) -> dict:
        # roles labels every token; the other probing tasks classify [CLS]
        return {**super().options(cfg), "token_level": cfg.task.name == "roles"}
