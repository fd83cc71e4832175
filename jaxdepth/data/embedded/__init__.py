"""The embedded English grammar (no downloads): its generator, which writes the pretraining
corpus and the annotated sentences the fine-tuning tasks are made from, and its recognizer."""
