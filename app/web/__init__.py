"""The web notebook: server-rendered Jinja pages and htmx fragments, one folder per page family.

    router.py     the one router `app.main` mounts: every family's routes, in match order
    accounts/     sign-in, sign-out, the password page, shared-run links
    notebooks/    the home page (list, new notebook, bundled examples), the notebook page and
                  its fields, errata and placements, rename / duplicate / delete
    runs/         the runs list, the run page and its views (verdicts, heatmaps, notes map,
                  attention regions), exports (CSV, JSON, SVG, report), present mode, compare
    skills/       the skills library
    serving/      replaying a notebook on a vLLM server and its results; the erratum gateway's page
    sweeps/       a notebook's sweeps: the panel, the sweep page (policy, frontier, worst cases), exports
    trajectories/ a notebook's trajectories: the Turns panel, the trajectory page, its report

Shared by every family, here at the top: `templating` (the Jinja environment and filters),
`forms` (form values into the API's schemas), `errors` (the error page and messages), `paging`
(a list a page at a time) and `components` (the `/_components` gallery of every UI piece).
In each family the `*pages` modules hold the routes; the `view` / `*_view` modules turn rows into
what a template shows and import no FastAPI; a `context` module gathers them for one page.
tests/test_layers.py checks this layout.
"""
