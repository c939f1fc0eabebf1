"""One function per action a user takes — create a notebook or a skill, compile a skill, change a
field, reorder errata, move or remove a placement, set the question, start or cancel a run — used
by the JSON API (`app.api.routes`) and the pages (`app.web`) alike, so both answer the same way.

The pattern every resource follows (notebooks, runs, replays, sweeps, and the ones to come):

- **The service builds the view.** Each resource has one typed view (pydantic), built here from
  the database with what it shows loaded first: a run's is `run_view.run_view` (the API's
  `RunOut`), a notebook's `notebook_view.notebook_view` (`NotebookOut`). The JSON route returns
  it, and the exports and the offline report embed it unchanged, so there is one shape per
  resource and a test holds them equal (tests/web/test_exports.py).
- **Routes and pages render it.** A route parses and validates the request, calls the action or
  the view builder, and answers; a page does the same and renders a template with a typed context
  (the run page's is `app.web.runs.context.RunPage`). A template never queries: what it shows is
  loaded before it renders (tests/web/test_templates_never_query.py renders every page with
  `app.web.templating.templates_never_query` on).
- **Only services commit.** Every public action is an `app.services.unit.action`: it commits when
  it returns and rolls back when it raises. Several actions that must stand or fall together run
  inside `saving(session)` (they commit once, at the end). No module of `app/api` or `app/web`
  calls `.commit()` (tests/api/test_services.py).

No HTTP here: impossible input raises `Unprocessable` (422 in both faces); a broker that cannot take
a message raises `data.queue.QueueUnavailable` (503), after which the caller saves nothing.
"""
