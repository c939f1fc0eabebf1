"""`kvnotes users …` and `kvnotes tokens …` as an operator types them: one line on stderr for each
change, the token alone on stdout, status 2 and one line for bad input."""

from __future__ import annotations

import os
from pathlib import Path

from tests.conftest import REPO, kvnotes_env
from tests.conftest import kvnotes_cli as _kvnotes


def test_users_and_tokens_from_the_command_line(tmp_path: Path) -> None:
    env = {**os.environ, **kvnotes_env(tmp_path), "PYTHONPATH": str(REPO)}
    done = _kvnotes("users", "add", "alice", "--password-stdin", env=env, stdin="a-long-password\n")
    assert done.returncode == 0
    done = _kvnotes("users", "add", "vera", "--role", "viewer", "--password-stdin", env=env, stdin="short\n")
    assert done.returncode == 2 and done.stderr.strip() == "kvnotes: password: 8 to 1024 characters"
    done = _kvnotes("users", "add", "alice", "--password-stdin", env=env, stdin="another-password\n")
    assert done.returncode == 2 and "exists already" in done.stderr
    assert _kvnotes("users", "add", "vera", "--role", "viewer", "--password-stdin", env=env,
                    stdin="viewer-password\n").returncode == 0
    listed = _kvnotes("users", "list", env=env).stdout.splitlines()
    assert [line.split("\t")[:2] for line in listed] == [["alice", "editor"], ["vera", "viewer"]]
    token = _kvnotes("tokens", "create", "alice", "--label", "ci", env=env)
    assert token.stdout.strip().startswith("kvn_") and len(token.stdout.splitlines()) == 1
    assert token.stdout.strip() not in _kvnotes("tokens", "list", env=env).stdout  # only a hint is shown
    assert _kvnotes("tokens", "revoke", token.stdout.strip(), env=env).returncode == 0
    assert _kvnotes("tokens", "revoke", "1", env=env).returncode == 2  # already gone
    assert _kvnotes("users", "remove", "vera", env=env).returncode == 0
    assert _kvnotes("users", "remove", "vera", env=env).returncode == 2
    names = [line.split("\t")[0] for line in _kvnotes("users", "list", env=env).stdout.splitlines()]
    assert names == ["alice"]
    # a new password: the old one stops working, a short one is refused with the rule, nothing changed
    done = _kvnotes("users", "passwd", "alice", "--password-stdin", env=env, stdin="short\n")
    assert done.returncode == 2 and done.stderr.strip() == "kvnotes: password: 8 to 1024 characters"
    done = _kvnotes("users", "passwd", "alice", "--password-stdin", env=env, stdin="a-newer-password\n")
    assert done.returncode == 0 and "0 session(s) signed out" in done.stderr
    from data.accounts import authenticate
    from data.db import get_sessionmaker
    from tests.conftest import applied

    with applied(kvnotes_env(tmp_path)), get_sessionmaker()() as session:
        assert authenticate(session, "alice", "a-long-password") is None
        assert authenticate(session, "alice", "a-newer-password") is not None
