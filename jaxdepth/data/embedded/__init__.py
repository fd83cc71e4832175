"""The embedded English grammar (no downloads): its generator, its recognizer, the seq2seq tasks
(semantic parsing, passivization) and the probing tasks it yields."""
