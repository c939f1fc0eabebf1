"""Heavy pages cannot starve the app: a real served app (sign-in required) and a finished run on
a long document, opened through a share link by ten visitors who all download its report at the
same instant. Each shared run builds at most `KVNOTES_MAX_HEAVY_RENDERS` (2) heavy pages at once;
the other visitors get 503 with Retry-After at once, not a seat in the request line, so a
signed-in `GET /api/notebooks` during the crowd answers 200. The report is built once: later
downloads are the stored bytes, and a matching If-None-Match is a 304."""

from __future__ import annotations

import threading
from pathlib import Path

import httpx

from tests.conftest import ServedApp, kvnotes_cli
from tests.web.finished_run import finished_run

SECRET = "s" * 16 + "-not-a-real-secret-but-long-enough-for-tests"
WORDS = " ".join(f"entry{i} was logged by the desk without remarks." for i in range(400))
DOC = f"Account record\nstatus: active\n\n{WORDS}\nOnly accounts whose status is active may log in."


def _long_run(app: ServedApp) -> int:
    from app.services.notebooks import add_field
    from data.models import Notebook, Question

    with app.db() as s:
        nb = Notebook(title="Long record", model="smollm2-135m", document=DOC, created_by="ada")
        s.add(nb)
        s.flush()
        at = DOC.index("active")
        add_field(s, nb, at, at + 6, "suspended", "status")
        nb.questions.append(Question(text="What is the status?", choices=["active", "suspended"]))
        s.commit()
        return finished_run(s, nb, strategies=("recompute", "prefix_reuse", "stale", "field_erratum")).id


def test_ten_report_downloads_through_a_share_link_leave_signed_in_reads_answering(tmp_path: Path) -> None:
    with ServedApp(tmp_path, KVNOTES_AUTH="required", KVNOTES_SECRET_KEY=SECRET) as app:
        added = kvnotes_cli("users", "add", "ada", "--password-stdin", env=app.env, stdin="a long password\n")
        assert added.returncode == 0, added.stderr
        token = kvnotes_cli("tokens", "create", "ada", env=app.env).stdout.strip()
        signed_in = httpx.Client(base_url=app.url, headers={"Authorization": f"Bearer {token}"}, timeout=120)
        run_id = _long_run(app)
        share = signed_in.post(f"/api/runs/{run_id}/shares")
        assert share.status_code == 201, share.text
        visitors = [httpx.Client(base_url=app.url, timeout=300) for _ in range(10)]
        for visitor in visitors:
            assert visitor.get(share.json()["url"]).status_code == 303  # to the run, the link remembered
        report = f"/runs/{run_id}/report.html?download=1"
        gate = threading.Barrier(11)
        answers: list[httpx.Response | BaseException | None] = [None] * 10

        def download(i: int) -> None:
            gate.wait()
            try:
                answers[i] = visitors[i].get(report)
            except httpx.HTTPError as exc:
                answers[i] = exc

        threads = [threading.Thread(target=download, args=(i,)) for i in range(10)]
        for t in threads:
            t.start()
        gate.wait()
        reads = [signed_in.get("/api/notebooks") for _ in range(6)]
        for t in threads:
            t.join()
        codes = [a.status_code if isinstance(a, httpx.Response) else repr(a) for a in answers]
        print(f"\nten report downloads: {({c: codes.count(c) for c in set(codes)})}; "
              f"signed-in reads during them: {[r.status_code for r in reads]}")
        assert [r.status_code for r in reads] == [200] * 6, [r.text[:200] for r in reads]
        assert set(codes) <= {200, 503} and codes.count(200) >= 1, codes
        busy = [a for a in answers if isinstance(a, httpx.Response) and a.status_code == 503]
        assert all(a.headers["retry-after"] == "5" and "heavy pages" in a.text for a in busy)
        built = {a.content for a in answers if isinstance(a, httpx.Response) and a.status_code == 200}
        again = visitors[0].get(report)
        assert again.status_code == 200 and again.content in built  # the stored bytes, not a new build
        assert visitors[1].get(report, headers={"If-None-Match": again.headers["etag"]}).status_code == 304
        assert visitors[2].get("/api/notebooks").status_code in (401, 403)  # a share opens its run only
