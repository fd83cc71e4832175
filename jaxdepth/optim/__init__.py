"""The optimizers and the learning-rate schedules, one class each, chosen by name
(optim.name, optim.schedule)."""
