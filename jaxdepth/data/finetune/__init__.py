"""Labelled datasets for fine-tuning: the published seq2seq benchmarks' readers, prefix-LM
features and packing, a fine-tuning run's prepared data, NER sentences."""
