"""kvnotes worker: the Celery process that owns the model, and the engine library it drives."""
