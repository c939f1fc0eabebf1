"""The data layer: settings, the ORM, typed contracts, the queue client, accounts, the worker
registry, health and the watchdog. Never torch or FastAPI."""
