"""The compose strategies, one file each: a context made of precompiled skills.
Every module here is imported by `worker.engine.strategies` and registers its class."""
