"""The edit strategies, one file each: a field of a document whose notes are cached changes.
Every module here is imported by `worker.engine.strategies` and registers its class."""
