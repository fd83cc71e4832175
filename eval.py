"""Evaluate a checkpoint, as JSON: python eval.py --help. The same as ``python -m
jaxdepth.eval`` and ``jaxdepth-eval`` of an installed package."""
from jaxdepth.eval import command, evaluate, main  # noqa: F401  (the tests' entries)

if __name__ == "__main__":
    command()
