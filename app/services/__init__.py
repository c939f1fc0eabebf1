"""One function per action a user takes — create a notebook or a skill, compile a skill, change a
field, reorder errata, move or remove a placement, set the question, start or cancel a run — used
by the JSON API (`app.api.routes`) and the pages (`app.web`) alike, so both answer the same way.

The pattern every resource follows (notebooks, runs, replays, sweeps, and the ones to come):

- **The service builds the view.** Each resource has one typed view (pydantic), built here from
  the database, eager-loading what it shows: a run's is `app.services.run_view.run_view` (the
  API's `RunOut`). The JSON route returns it, the page renders it, the exports and the offline
  report embed it unchanged, so there is one shape per resource and a test can hold them equal.
- **Routes and pages render it.** A route parses and validates the request, calls the action or
  the view builder, and answers; a page does the same and renders a template with views (never an
  ORM row a template could walk into a query).
- **Only services commit.** Every public action is an `app.services.unit.action`: it commits when
  it returns and rolls back when it raises. Several actions that must stand or fall together run
  inside `saving(session)` (they commit once, at the end). No module of `app/api` or `app/web`
  calls `.commit()` (tests/api/test_services.py).

No HTTP here: impossible input raises `Unprocessable` (422 in both faces); a broker that cannot take
a message raises `data.queue.QueueUnavailable` (503), after which the caller saves nothing.
"""
