"""The edit strategies by name, in the order every view lists them. Pure Python with no imports, so
the web app and the engine share one list (the engine may import `app`'s plain modules; `app` never
imports the engine)."""

STRATEGIES = ("recompute", "prefix_reuse", "stale", "in_place", "erratum", "field_erratum", "selective", "auto")
