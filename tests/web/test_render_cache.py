"""A finished run's heavy pages are built once and served again from store with an ETag: the
report, the exports and the painted attention views of a finished run are stored (one row per
render and view), answered byte for byte the same the second time, 304 to a matching If-None-Match,
kept apart per view, never stored for a run still running, and gone with their run."""

from __future__ import annotations

import json

from tests.web.conftest import finished, session

PAGES = ("report.html", "report.html?download=1", "export.json", "export.csv", "heatmap.svg",
         "heatmap.svg?strategy=stale&layer=1&head=2", "notes-map.svg", "attention/paint?rows=1",
         "attention/paint?strategy=stale&agg=max", "attention/heads?strategy=stale", "regions")


def _stored(run_id: int) -> list[str]:
    """The keys of the renders stored for `run_id` (any run that had the id)."""
    from data.renders import renders_dir

    return sorted(json.loads(p.read_bytes().split(b"\n", 1)[0])["key"]
                  for folder in renders_dir().glob(f"{run_id}-*") for p in folder.glob("*.render"))


def test_a_finished_runs_heavy_pages_are_built_once_and_served_with_an_etag(make_client) -> None:
    client = make_client()
    nb, run_id = finished(client)
    first = {page: client.get(f"/runs/{run_id}/{page}") for page in PAGES}
    assert {p: r.status_code for p, r in first.items()} == dict.fromkeys(PAGES, 200)
    assert len(_stored(run_id)) == len(PAGES)  # one stored render per page and view
    assert "attention/paint?agg=max&strategy=stale" in _stored(run_id)  # keyed by the sorted view
    for page, r in first.items():
        etag = r.headers["etag"]
        assert etag.startswith('"') and len(etag) == 34 and r.headers["cache-control"] == "private, no-cache"
        again = client.get(f"/runs/{run_id}/{page}")
        assert again.content == r.content and again.headers["etag"] == etag, page
        assert again.headers["content-type"] == r.headers["content-type"]
        unchanged = client.get(f"/runs/{run_id}/{page}", headers={"If-None-Match": etag})
        assert unchanged.status_code == 304 and unchanged.content == b"" and unchanged.headers["etag"] == etag
        assert client.get(f"/runs/{run_id}/{page}", headers={"If-None-Match": '"other"'}).status_code == 200
    page = client.get(f"/runs/{run_id}").text  # the page opens without it, then asks for it
    assert f'hx-get="/runs/{run_id}/regions"' in page and "regions-title" not in page
    assert 'id="regions"' in first["regions"].text and "regions-title" in first["regions"].text
    report = client.get(f"/runs/{run_id}/report.html?download=1")
    assert "default-src 'none'" in report.headers["content-security-policy"]  # its own policy, kept
    assert report.headers["content-disposition"] == f'attachment; filename="run-{run_id}-report.html"'
    assert "content-disposition" not in first["report.html"].headers
    assert first["heatmap.svg"].content != first["heatmap.svg?strategy=stale&layer=1&head=2"].content
    assert len(_stored(run_id)) == len(PAGES)  # nothing built twice
    assert client.get(f"/runs/{run_id}/report.html?layer=999").status_code == 422  # refused, not stored
    assert len(_stored(run_id)) == len(PAGES)
    assert client.delete(f"/api/notebooks/{nb}").status_code == 204  # its runs go with it
    _, other = finished(client)  # SQLite may issue the deleted run's id again: never its renders
    assert client.get(f"/runs/{other}/export.csv").status_code == 200  # storing one prunes the gone
    assert _stored(run_id) == [] or other == run_id
    assert _stored(other) == ["export.csv"]  # the deleted run's renders went with it


def test_a_run_still_running_is_built_every_time(make_client) -> None:
    from data.models import Run

    client = make_client()
    _, run_id = finished(client)
    with session() as s:
        s.get(Run, run_id).status = "running"
        s.commit()
    assert client.get(f"/runs/{run_id}/export.json").status_code == 200
    assert client.get(f"/runs/{run_id}/attention/paint").status_code == 200
    assert _stored(run_id) == []
