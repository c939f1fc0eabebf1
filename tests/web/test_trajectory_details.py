"""The trajectory page's details (issue 33 item 7): agreement read on the turns that changed
recompute's decision (stale's 2 of 4 in all is 0 of the 2 that count), a turn that sets the value
back says why its "edit followed" cell is empty, the cumulative TTFT axis in seconds, the turn axis
numbered and the legends legible; the API states the same counts."""

from __future__ import annotations

import re

from tests.web.finished_trajectory import finished_trajectory


def test_agreement_counts_the_turns_that_changed_recompute_s_decision(make_client) -> None:
    client = make_client()
    tid = finished_trajectory()
    data = client.get(f"/api/trajectories/{tid}").json()
    stale, erratum = data["summary"]["stale"], data["summary"]["erratum"]
    assert (stale["agreed"], stale["turns"]) == (2, 4)  # the no-edit turn and the revert, both trivial
    assert (stale["changed_agreed"], stale["changed_turns"]) == (0, 2)
    assert (erratum["changed_agreed"], erratum["changed_turns"]) == (1, 2)
    assert data["verdicts"]["stale"].startswith(
        "on the 2 turns that changed recompute's decision stale agreed on 0 (2 of 4 turns in all)")
    page = client.get(f"/trajectories/{tid}").text
    assert "On the 2 turns that changed recompute&#39;s decision stale agreed on 0" in page
    assert re.search(r'class="changed-agreement">0/2<', page)
    assert re.search(r'class="changed-agreement">1/2<', page)
    # the turn that set the value back says why no strategy "follows" anything there
    turn4 = page[page.index('id="turn-4"'):]
    assert turn4.count("set back to the document's value: nothing to follow") == 3
    assert page[page.index('id="turn-1"'):page.index('id="turn-2"')].count("nothing to follow") == 0
    # the cumulative TTFT axis in seconds (40 s at the top), the turns numbered 1..4
    assert "40 s</text>" in page and "4e+04" not in page and "Cumulative TTFT per strategy (seconds)" in page
    assert [int(n) for n in re.findall(r'class="turn-tick"[^>]*>(\d+)<', page)][:4] == [1, 2, 3, 4]
    report = client.get(f"/trajectories/{tid}/report.html").text
    assert "set back to the document's value: nothing to follow" in report and "40 s</text>" in report
