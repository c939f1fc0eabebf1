"""How long a long run's heavy pages take on this machine (issue 24, finding 6): a finished run of
about `--tokens` document tokens with smollm2-135m's attention shape (30 layers × 9 heads), written
straight into a fresh database as a worker writes one, then the run page, the report, the painted
view and the JSON export asked twice each through the app in this process (the second answer is
the stored render). Prints one line per page with both times in ms and the bytes.

    .venv/bin/python bench/heavy_pages.py --tokens 7000
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=7000)
    args = parser.parse_args()
    data = Path(tempfile.mkdtemp(prefix="kvnotes-heavy-"))
    os.environ.update({"KVNOTES_DATA": str(data), "DATABASE_URL": f"sqlite:///{data}/kvnotes.db",
                       "BROKER_URL": f"sqla+sqlite:///{data}/broker.db",
                       "RESULT_BACKEND": f"db+sqlite:///{data}/results.db"})
    from fastapi.testclient import TestClient

    import tests.web.finished_run as fr
    from app.main import create_app
    from app.services.notebooks import add_field
    from data.db import get_sessionmaker
    from data.migrate import upgrade_to_head
    from data.models import Notebook, Question

    fr.LAYERS, fr.HEADS = 30, 9  # smollm2-135m's shape
    upgrade_to_head()
    words = " ".join(f"entry{i}" for i in range(args.tokens))
    doc = f"Account record\nstatus: active\n\n{words}\nOnly accounts whose status is active may log in."
    with get_sessionmaker()() as s:
        nb = Notebook(title="Long record", model="smollm2-135m", document=doc)
        s.add(nb)
        s.flush()
        at = doc.index("active")
        add_field(s, nb, at, at + 6, "suspended", "status")
        nb.questions.append(Question(text="What is the status?", choices=["active", "suspended"]))
        s.commit()
        run = fr.finished_run(s, nb, strategies=("recompute", "prefix_reuse", "stale", "field_erratum"))
        run_id, tokens = run.id, len(run.results[0].tokens)
    client = TestClient(create_app(), base_url="http://127.0.0.1", client=("127.0.0.1", 50000),
                        raise_server_exceptions=False)
    print(f"run {run_id}: {tokens} tokens per strategy, 4 strategies, attention 30 × 9")
    for page in ("", "/report.html", "/attention/paint?rows=1", "/export.json"):
        times, size = [], 0
        try:
            for _ in range(2):
                t0 = time.perf_counter()
                r = client.get(f"/runs/{run_id}{page}")
                times.append((time.perf_counter() - t0) * 1000)
                size = len(r.content)
                if r.status_code != 200:
                    raise RuntimeError(f"{r.status_code}: {r.text[:200]}")
        except Exception as exc:  # report it and go on with the other pages
            print(f"/runs/{run_id}{page}: failed: {type(exc).__name__}: {str(exc)[:200]}", flush=True)
            continue
        print(f"/runs/{run_id}{page or ' (run page)'}: first {times[0]:.0f} ms, again {times[1]:.0f} ms, "
              f"{size / 1e6:.2f} MB", flush=True)


if __name__ == "__main__":
    main()
