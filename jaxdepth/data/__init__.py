"""Data: tokenizer, corpus readers, grain pipelines (and the embedded grammar)."""
