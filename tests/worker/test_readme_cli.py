"""The README's command line as printed: its bash block runs in a plain shell after
`scripts/run.sh` installed `.venv` (activation puts `kvnotes` on PATH), the `edit` example answers
what the README shows, and the app and the command line share one default data folder."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
README = (REPO / "README.md").read_text(encoding="utf-8")


def section(title: str) -> str:
    start = README.index(f"\n## {title}\n")
    end = README.find("\n## ", start + 1)
    return README[start:end]


def commands() -> list[str]:
    """The Command line section's bash block, one command per entry (continuations joined, comments
    and comment-only lines dropped)."""
    block = re.search(r"```bash\n(.*?)```", section("Command line"), re.S).group(1)
    joined = re.sub(r"\\\n\s*", "", block)
    out = []
    for line in joined.splitlines():
        line = re.sub(r"\s+#.*$", "", line).strip()
        if line and not line.startswith("#"):
            out.append(line)
    return out


def printed_table() -> dict[str, str]:
    """strategy → decision, from the README's text block of what `edit` prints."""
    block = re.search(r"```text\n(.*?)```", section("Command line"), re.S).group(1)
    return {m.group(1): m.group(2) for m in re.finditer(r"^(\w+)\s+(\S+)\s+\d+\.\d{4}\s", block, re.M)}


def plain_shell(script: str, data: Path) -> subprocess.CompletedProcess:
    """`script` in bash from the repository root, with a PATH that has no kvnotes on it."""
    venv_bin = str(REPO / ".venv" / "bin")
    path = os.pathsep.join(p for p in os.environ.get("PATH", "").split(os.pathsep) if p and p != venv_bin)
    env = {**{k: v for k, v in os.environ.items() if k != "VIRTUAL_ENV"}, "PATH": path,
           "KVNOTES_DATA": str(data)}
    return subprocess.run(["bash", "-euo", "pipefail", "-c", script], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=900)


def test_the_readme_says_how_kvnotes_gets_on_path_and_documents_the_port() -> None:
    listed = commands()
    assert listed[0] == "source .venv/bin/activate"
    assert plain_shell("command -v kvnotes || echo missing", REPO / "var").stdout.strip() == "missing"
    assert "scripts/run.sh --port 8001" in section("Start")
    assert ("source" in (REPO / "scripts" / "run.sh").read_text()
            and "activate" in (REPO / "scripts" / "run.sh").read_text())


def test_one_default_data_folder_whatever_the_directory(tmp_path) -> None:
    """`kvnotes` typed anywhere reads the folder `scripts/run.sh` serves from (the checkout's var/)."""
    env = {k: v for k, v in os.environ.items() if k not in ("KVNOTES_DATA", "DATABASE_URL",
                                                            "BROKER_URL", "RESULT_BACKEND")}
    probe = "from data.settings import get_settings; print(get_settings().data_dir)"
    elsewhere = subprocess.run([sys.executable, "-c", probe], cwd=tmp_path,
                               env={**env, "PYTHONPATH": str(REPO)},
                               capture_output=True, text=True, timeout=60)
    assert elsewhere.stdout.strip() == str(REPO / "var"), elsewhere.stderr


@pytest.mark.slow
def test_the_readme_command_line_runs_as_printed(data_dir) -> None:
    listed = commands()
    models = next(c for c in listed if c.startswith("kvnotes models"))
    edit = next(c for c in listed if c.startswith("kvnotes edit --model"))
    result = plain_shell(f"{listed[0]}\n{models}\necho ---\n{edit}", data_dir)
    assert result.returncode == 0, result.stderr[-2000:]
    listing, table = result.stdout.split("---\n")
    assert re.search(r"^smollm2-135m\s", listing, re.M)
    answered = {m.group(1): m.group(2) for m in re.finditer(r"^(\w+)\s+(\S+)\s+\d+\.\d{4}\s", table, re.M)}
    shown = printed_table()
    assert len(shown) >= 5 and answered == shown  # the README shows what the model answers
    assert table.splitlines()[0] == "gemma3-270m: 34 document tokens"


@pytest.mark.slow
def test_the_readme_compose_and_attribute_examples_run_as_printed(data_dir) -> None:
    listed = commands()
    for prefix in ("kvnotes compose", "kvnotes attribute"):
        command = next(c for c in listed if c.startswith(prefix))
        result = plain_shell(f"{listed[0]}\n{command}", data_dir)
        assert result.returncode == 0, (command, result.stderr[-2000:])
        if "--json" in command:
            assert "recompute" in json.loads(result.stdout)["strategies"]
        else:
            assert result.stdout.strip(), command
