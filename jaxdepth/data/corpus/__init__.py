"""Text to token batches for pretraining: corpus readers, the SentencePiece tokenizer, a run's
prepared token streams, packing, C4-scale streaming, the grain pipelines, MLM + SOP examples."""
