"""One function per action a user takes — create a notebook or a skill, compile a skill, change a
field, reorder errata, move or remove a placement, set the question, start or cancel a run — used
by the JSON API (`app.api.routes`) and the pages (`app.web`) alike, so both answer the same way.

No HTTP here: impossible input raises `Unprocessable` (422 in both faces); a broker that cannot take
a message raises `data.queue.QueueUnavailable` (503), after which the caller saves nothing.
"""
