"""What the command-line tests share: a small record, the launcher run as a subprocess, and a
fixture writing the record and a skill to files; and the immutable flag (`chattr +i`) the storage
fault tests use, which must bind: where it cannot (no chattr, not root, overlayfs or tmpfs), those
tests fail under `CI=true`, as the suite's other real-service tests do, and skip elsewhere (issue 49:
they skipped everywhere, so in CI they could never fail)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import missing

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


def _chattr(flag: str, *paths: Path) -> subprocess.CompletedProcess:
    return subprocess.run(["chattr", flag, *map(str, paths)], capture_output=True, text=True)


def _immutable_flag_binds(folder: Path) -> None:
    """Unless `chattr +i` works here and stops a write (root included): a failure under `CI=true`, a
    skip elsewhere, saying why (`tests.conftest.missing`)."""
    probe = folder / "chattr-probe"
    probe.write_text("x")
    try:
        done = _chattr("+i", probe)
    except FileNotFoundError:
        probe.unlink()
        missing("chattr is not installed (e2fsprogs)")
    if done.returncode != 0:
        probe.unlink()
        missing(f"chattr +i does not work on this file system or as this user: {done.stderr.strip()}")
    try:
        with probe.open("a") as f:
            f.write("y")
        missing("chattr +i does not stop a write here")
    except PermissionError:
        pass
    finally:
        _chattr("-i", probe)
        probe.unlink()
