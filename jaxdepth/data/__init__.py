"""Data, by concern: ``corpus/`` turns text into the token batches of pretraining (readers,
tokenizer, grain pipelines, streaming, packing, MLM + SOP), ``embedded/`` is the English grammar
that needs no download (generator and recognizer), ``finetune/`` holds the labelled datasets of
fine-tuning (seq2seq benchmarks and the grammar's tasks, probing tasks, NER sentences) and their
features; ``download.py`` fetches the published datasets. finetune imports corpus and
embedded, corpus imports embedded, and nothing imports back."""
