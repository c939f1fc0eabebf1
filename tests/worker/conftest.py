"""What the command-line tests share: a small record, the launcher run as a subprocess, and a
fixture writing the record and a skill to files."""

from __future__ import annotations

import subprocess
import sys

import pytest

DOC = "Account record.\nstatus: active\nowner: Ada\nOnly active accounts may log in.\n"


def kvnotes(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "commands.cli", *args], capture_output=True,
                          text=True, timeout=300)


@pytest.fixture
def doc(tmp_path):
    path = tmp_path / "doc.txt"
    path.write_text(DOC)
    skill = tmp_path / "skill.txt"
    skill.write_text("Answer in one word.\n")
    return path, skill
