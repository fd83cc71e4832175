"""train.py's closing text (jaxdepth/tasks/summary_text.py): each kind's results, recognised from
its summary alone, word for word as each Task's own report printed them before the text
moved out of the tasks (the expected strings are that code's output on these summaries)."""
import pytest

from jaxdepth.tasks.summary_text import RESULTS, results, summary_text

UNK = {"examples_with_unk": 2, "examples": 100, "unknown_words": {"zorp": 1, "blick": 2}}
NER = {"best_dev_f1": 0.61234, "best_step": 40, "test_f1_at_best": 0.5987, "test_f1": 0.6011,
       "analysis": "runs/n/analysis/ner.json"}
FILES = {"checkpoints": "runs/n/checkpoints", "metrics": "runs/n/metrics.jsonl",
         "tensorboard": "runs/n/tb", "run_dir": "runs/n"}

CASES = [
    ({"valid_ppl": 12.3456, "valid_loss": 2.5133, "grammatical": 0.75,
      "grammar_check": {"continuations": 8}},
     "validation perplexity 12.346 (loss 2.5133)\ngrammatical: 75% of 8 sampled continuations"
     " of validation prompts derive from the grammar's rules"),
    ({"valid_ppl": 12.3456, "valid_loss": 2.5133, "grammar_check": {"continuations": 0}},
     "validation perplexity 12.346 (loss 2.5133)"),
    ({"dev_loss": 0.83009, "id_accuracy": 0.97, "gen_accuracy": 0.5, "lexical": 0.66,
      "structural": None, "unk": UNK},
     "dev loss 0.8301; exact match: id_accuracy 0.970, gen_accuracy 0.500, lexical 0.660\n"
     "warning: 2 of 100 examples contain pieces unknown to the tokenizer, e.g. "
     "['zorp', 'blick']"),
    ({"table1": {"mlm_accuracy": 0.4321, "sop_accuracy": 0.9,
                 "iterations": {"all": 3.25, "CLS": None, "punct": 2.5},
                 "histogram": {"all": {"1": 3, "2": 1}}, "tokens": {"all": 4}},
      "analysis": "runs/act/analysis"},
     "MLM accuracy 43.2%, SOP accuracy 90.0%\nmean iterations: all 3.25, punct 2.50\n"
     "tokens by iterations: 1: 75.0%, 2: 25.0%\nTable 1 and Fig. 2: runs/act/analysis"),
    ({"probe": {"arch": "act", "task": "roles", "dev": {"accuracy": 0.79},
                "test": {"accuracy": 0.812, "mean_iterations": 4.125}},
      "analysis": "runs/p/analysis"},
     "act on roles: test accuracy 81.2% (dev 79.0%), mean iterations 4.12\n"
     "results: runs/p/analysis"),
    ({"mlm_perplexity": 45.678, "mlm_loss": 3.8216, "mlm_accuracy": 0.2345},
     "held-out MLM perplexity 45.678 (loss 3.8216, accuracy 23.4%)"),
    (NER, "best dev F1 61.23 at step 40 (test F1 there 59.87; final test F1 60.11)\n"
          "results: runs/n/analysis/ner.json"),
]


@pytest.mark.parametrize("summary, text", CASES)
def test_each_kind_s_results(summary, text):
    assert results(summary) == text


def test_a_summary_holds_one_kind_s_results():
    assert len({k for k, _ in RESULTS}) == len(RESULTS)
    with pytest.raises(ValueError, match="found 2"):
        results({**CASES[0][0], **CASES[5][0]})
    with pytest.raises(ValueError, match="found 0"):
        results({"step": 3})


def test_solo_trials_and_stopped_runs():
    solo = {"step": 60, "done": True, "train_loss": 0.1234, **NER, "tokens_per_s": 12345.6,
            "mfu": 0.0123, "peak_flops": 2.5e11, "peak_source": "measured", **FILES}
    assert summary_text(solo) == (
        "\nfinished step 60: train loss 0.1234, best dev F1 61.23 at step 40 (test F1 there "
        "59.87; final test F1 60.11)\nresults: runs/n/analysis/ner.json\nthroughput 12,346 "
        "tokens/s, MFU 1.2% of 250 GFLOP/s per device (measured)\ncheckpoints: "
        "runs/n/checkpoints\nmetrics:     runs/n/metrics.jsonl (TensorBoard: runs/n/tb)\n"
        "summary:     runs/n/summary.json")
    trials = {"step": 60, "done": True, "n_trials": 3, "n_frozen": 1, "trials": [
        {"trial": 0, "settings": {"run.seed": 0}, "frozen": False, "train_loss": 0.2,
         **NER, "best_dev_f1": 0.6},
        {"trial": 1, "settings": {"run.seed": 1}, "frozen": False, "train_loss": 0.3,
         **NER, "best_dev_f1": 0.7},
        {"trial": 2, "settings": {"run.seed": 2}, "frozen": True}],
        "mean": {"best_dev_f1": 0.65, "best_step": 40.0, "valid_tokens": 9.0},
        "ci95": {"best_dev_f1": 0.6353, "best_step": 0.0, "valid_tokens": 0.0}, **FILES}
    assert summary_text(trials) == (
        "\nfinished step 60: 3 trials, 1 frozen\ntrial 0 (run.seed=0): train loss 0.2000, best "
        "dev F1 60.00 at step 40 (test F1 there 59.87; final test F1 60.11)\n    results: "
        "runs/n/analysis/ner.json\ntrial 1 (run.seed=1): train loss 0.3000, best dev F1 70.00 "
        "at step 40 (test F1 there 59.87; final test F1 60.11)\n    results: "
        "runs/n/analysis/ner.json\ntrial 2 (run.seed=2): frozen (non-finite)\nmean ± 95% CI "
        "over trials [0, 1]: best_dev_f1 0.65 ± 0.64\ncheckpoints: runs/n/checkpoints\n"
        "metrics:     runs/n/metrics.jsonl (TensorBoard: runs/n/tb)\n"
        "summary:     runs/n/summary.json")
    stopped = {"step": 30, "done": False, **FILES}
    assert summary_text(stopped) == (
        "stopped at step 30 (run.stop_after), checkpoint of step 30 saved; resume with the "
        "same command.\ncheckpoints: runs/n/checkpoints\nmetrics:     runs/n/metrics.jsonl "
        "(TensorBoard: runs/n/tb)")
