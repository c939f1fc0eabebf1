"""Passwords follow explicit rules wherever one is set (the account page and `kvnotes users
add/passwd` both go through `data.accounts.check_password`): 8 to 1024 characters, no NUL or other
control character, not blank (12 spaces, zero-width characters only), no U+FFFD. A refused password
changes nothing: the old one still signs in, no user is added."""

from __future__ import annotations

import os
from pathlib import Path

from tests.conftest import REPO, kvnotes_cli, kvnotes_env

BAD = {
    "12 spaces": (" " * 12, "cannot be blank"),
    "zero-width only": ("\u200b" * 12, "cannot be blank"),
    "a NUL": ("password\x00password", "NUL"),
    "a control character": ("password\x07password", "control character"),
    "U+FFFD": ("\ufffd" * 12, "U+FFFD"),
}


def test_the_account_page_refuses_each_bad_password_and_keeps_the_old_one(make_client) -> None:
    from data.accounts import add_user, authenticate
    from data.db import get_sessionmaker

    client = make_client(KVNOTES_AUTH="required")
    with get_sessionmaker()() as session:
        add_user(session, "alice", "alice-password")
        session.commit()
    signed_in = client.post("/login", data={"name": "alice", "password": "alice-password"},
                            follow_redirects=False)
    assert signed_in.status_code == 303
    for what, (password, words) in BAD.items():
        r = client.post("/account/password", headers={"Sec-Fetch-Site": "same-origin"},
                        data={"current": "alice-password", "new": password, "again": password})
        assert r.status_code == 422 and words in r.text, what
    with get_sessionmaker()() as session:  # the old password is the password still
        assert authenticate(session, "alice", "alice-password") is not None


def test_the_command_line_refuses_each_bad_password_and_adds_no_user(tmp_path: Path) -> None:
    env = {**os.environ, **kvnotes_env(tmp_path), "PYTHONPATH": str(REPO)}
    for what, (password, words) in BAD.items():
        done = kvnotes_cli("users", "add", "alice", "--password-stdin", env=env, stdin=password + "\n")
        assert done.returncode == 2 and words in done.stderr, (what, done.stderr)
    listed = kvnotes_cli("users", "list", env=env)
    assert listed.returncode == 0 and "alice" not in listed.stdout + listed.stderr
    assert kvnotes_cli("users", "add", "alice", "--password-stdin", env=env,
                       stdin="a fine password\n").returncode == 0
