"""The one router of the HTML pages, which `app.main` mounts: each page family's routes
(`accounts/`, `notebooks/`, `runs/`, `skills/`, `serving/`, `sweeps/`, `trajectories/`) and the
component gallery, included in one place so the order they are matched in is written down here.
"""

from __future__ import annotations

from fastapi import APIRouter

from app.web import components
from app.web.accounts import pages as account_pages
from app.web.notebooks import home_pages, manage_pages
from app.web.notebooks import pages as notebook_pages
from app.web.runs import compare_pages, export_pages, present_pages
from app.web.runs import pages as run_pages
from app.web.serving import gateway_pages
from app.web.serving import pages as serving_pages
from app.web.skills import pages as skill_pages
from app.web.sweeps import pages as sweep_pages
from app.web.trajectories import pages as trajectory_pages

router = APIRouter(include_in_schema=False)
for _module in (account_pages, notebook_pages, manage_pages, run_pages, export_pages, present_pages,
                compare_pages, skill_pages, serving_pages, gateway_pages, sweep_pages, trajectory_pages,
                components,
                home_pages):
    router.include_router(_module.router, include_in_schema=False)
