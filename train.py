"""Train (or resume) a jaxdepth model: python train.py --help lists every field. The same as
``python -m jaxdepth.train`` and ``jaxdepth-train`` of an installed package."""
from jaxdepth.train import command, main  # noqa: F401  (main(argv): the tests' entry)

if __name__ == "__main__":
    command()
