"""Labelled datasets for fine-tuning: the published seq2seq benchmarks' readers, the embedded
grammar's seq2seq and probing tasks, prefix-LM features and packing, a fine-tuning run's
prepared data, NER sentences."""
