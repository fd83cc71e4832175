"""jaxdepth: studying depth in transformers, in pure JAX."""

__version__ = "0.1.0"
