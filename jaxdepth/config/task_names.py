"""The values of ``task.name``: what a run trains on, not what kind of run it is (that is its
run kind, jaxdepth/config/run_kinds/). A leaf module, so that the run kinds can name the tasks they
train on without importing the config schema that validates against them."""

# Prefix-LM fine-tuning on a seq2seq task: the embedded grammar's (GRAMMAR_TASKS) or a
# published benchmark read from task.dir (data/finetune/seq2seq_readers.py).
TASKS = ("semantic_parsing", "passivization", "cogs", "cogs_vf", "geoquery")
GRAMMAR_TASKS = ("semantic_parsing", "passivization")
# Encoder fine-tuning / probing tasks from the embedded grammar (data/finetune/probing.py).
PROBE_TASKS = ("tense", "subj_number", "obj_number", "roles")
# Layer fusion over any backbone (docs/design.md §4): NER from task.dir, MLM on data.corpus.
FUSION_TASKS = ("ner", "mlm")
# The tasks that need no task.dir: the embedded grammar's, and fusion MLM (on data.corpus).
NO_DIR_TASKS = GRAMMAR_TASKS + PROBE_TASKS + ("mlm",)
