"""Imports have no side effects: `import app.main` with an empty data folder writes nothing there;
the secret key file appears when a server first asks for `app.main:app`."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from tests.conftest import kvnotes_env

REPO = Path(__file__).resolve().parents[2]


def _python(code: str, data: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("KVNOTES_")}
    env.update(kvnotes_env(data))
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]


def test_importing_the_app_writes_nothing_and_serving_it_makes_the_key(tmp_path: Path) -> None:
    data = tmp_path / "data"
    data.mkdir()
    _python("import app.main, app.web.router, app.services.notebooks", data)
    assert sorted(os.listdir(data)) == []  # no key file, no database, nothing
    _python("from app.main import app; assert app.title == 'kvnotes'", data)
    assert sorted(os.listdir(data)) == ["secret_key"]
    assert oct((data / "secret_key").stat().st_mode & 0o777) == "0o600"
