"""Importing the tasks imports every task module (so that each run kind finds the Task class
that names it, jaxdepth/tasks/__init__.py): none may load a heavy dependency at module level
that only some kinds use. seqeval (NER's scorer) loads scikit-learn, scipy and pandas, about a
second of every run's start-up; it is imported where NER is scored."""
import subprocess
import sys

HEAVY = ("seqeval", "sklearn", "pandas", "torch")


def test_importing_the_tasks_loads_no_scorer_stack():
    code = ("import sys, jaxdepth.tasks; "
            f"print(sorted(m for m in {HEAVY!r} if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
