"""Issue 51 items 8 and 9 in real Chromium: after Adopt, the run form has `auto` ticked (its label
says it follows the adopted policy, so Run right away runs it); the Runs page counts the sweep
edits that ran (finished), not the queued ones of a sweep still running."""

from __future__ import annotations

import pytest

from tests.conftest import ServedApp, api_call, chromium, until
from tests.web.finished_run import finished_sweep

sync_api = chromium()
pytestmark = [pytest.mark.browser, pytest.mark.slow]
expect = sync_api.expect


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    served = ServedApp(tmp_path_factory.mktemp("adopt-count"), "smollm2-135m")
    yield served
    served.stop()


def test_after_adopt_auto_is_ticked_and_run_runs_it(server, browser) -> None:
    nb, sweep = finished_sweep(server)
    page = browser.new_context(viewport={"width": 1280, "height": 800}, bypass_csp=True).new_page()
    page.goto(f"{server.url}/notebooks/{nb}")
    auto = page.locator('#run-form input[name="strategies"][value="auto"]')
    expect(auto).not_to_be_checked()  # no adopted policy yet: auto is an oracle pick, off by default
    page.goto(f"{server.url}/sweeps/{sweep}?threshold=0.3")
    page.get_by_role("button", name="Adopt this policy").click()
    page.wait_for_url(f"**/notebooks/{nb}#adopted-policy")
    policy = api_call(f"{server.url}/api/notebooks/{nb}")["policy_strategy"]
    assert policy
    expect(page.locator("#run-form .auto-policy")).to_contain_text(f"follows the adopted policy: {policy}")
    expect(auto).to_be_checked()
    # Run at once: the run queued (no worker here) runs auto
    page.locator("#q-text").fill("Can this customer log in?")
    page.locator("#run-form button.run").click()
    strategies = until("the run is queued", lambda: _own_run(server, nb), 30)
    assert "auto" in strategies, strategies
    page.context.close()


def _own_run(server, nb: int) -> list[str] | None:
    """The strategies of the notebook's run started from its form (not a sweep's edit), once it exists."""
    from sqlalchemy import select

    from data.models import Run

    with server.db() as s:
        run = s.scalar(select(Run).where(Run.notebook_id == nb, Run.sweep_id.is_(None)))
        return list(run.strategies) if run is not None else None


def test_the_runs_page_counts_the_sweep_edits_that_ran(server, browser) -> None:
    from sqlalchemy import func, select

    from data.models import Run, RunStatus

    nb, _ = finished_sweep(server)  # 3 edits, all finished
    running = api_call(f"{server.url}/api/notebooks/{nb}/sweeps", "POST",
                       {"question": "Can this customer log in?", "choices": ["yes", "no"],
                        "strategies": ["recompute", "erratum"],
                        "values": {"status": [f"state {i}" for i in range(10)]}})
    sweep_edits = select(func.count(Run.id)).where(Run.sweep_id.is_not(None))
    with server.db() as s:  # of the running sweep's 10 edits, 2 ran (one failed), 1 runs, 7 wait
        edits = list(s.scalars(select(Run).where(Run.sweep_id == running["id"]).order_by(Run.id)))
        assert len(edits) == 10
        edits[0].status, edits[1].status, edits[2].status = (RunStatus.SUCCEEDED, RunStatus.FAILED,
                                                             RunStatus.RUNNING)
        s.commit()
        ran = s.scalar(sweep_edits.where(Run.status.in_((RunStatus.SUCCEEDED, RunStatus.FAILED))))
        listed = s.scalar(sweep_edits.where(Run.status != RunStatus.CANCELLED))
    assert ran >= 5 and listed == ran + 8, (ran, listed)  # at least this test's 3 + 2 ran; 8 have not
    page = browser.new_context(viewport={"width": 1280, "height": 800}, bypass_csp=True).new_page()
    page.goto(f"{server.url}/runs")
    said = f"Not listed: {ran} sweep edits that ran, on their sweeps' pages."
    expect(page.locator(".runs-sweep-edits")).to_have_text(said)
    page.context.close()
