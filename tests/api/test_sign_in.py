"""Signing in on a shared server, through the real app and database: sessions end on the server
(signing out, changing a password on the page or with `kvnotes users passwd`), failed sign-ins are
limited per account and per client address with backoff (429 + Retry-After, the same words on
the page), and a crowd of sign-ins waits for a few password-hash slots or is told to come back."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
from fastapi.testclient import TestClient

from tests.conftest import REPO, free_port, kvnotes_cli, kvnotes_env

DOC = "Customer record. status: active. age: 34."
SAME = {"Sec-Fetch-Site": "same-origin"}


def _user(name: str = "alice", password: str | None = None, role: str = "editor") -> None:
    from data.accounts import add_user
    from data.db import get_sessionmaker

    with get_sessionmaker()() as session:
        add_user(session, name, password or f"{name}-password", role)
        session.commit()


def _browser(client: TestClient, address: str = "127.0.0.1", cookie: str | None = None) -> TestClient:
    """Another browser on the same app (its own cookie jar), from `address`."""
    other = TestClient(client.app, base_url="http://127.0.0.1", client=(address, 50001))
    if cookie is not None:
        other.cookies.set("kvnotes_session", cookie)
    return other


def _sign_in(client: TestClient, name: str = "alice", password: str | None = None) -> str:
    r = client.post("/login", data={"name": name, "password": password or f"{name}-password"},
                    follow_redirects=False)
    assert r.status_code == 303, r.text
    return client.cookies["kvnotes_session"]


def _csrf(client: TestClient) -> str:
    return re.search(r'"X-CSRF-Token": "([^"]+)"', client.get("/").text).group(1)


def _reads_and_writes(client: TestClient, csrf: str) -> tuple[int, int]:
    read = client.get("/api/notebooks").status_code
    write = client.post("/api/notebooks", json={"title": "t", "text": DOC},
                        headers={"X-CSRF-Token": csrf}).status_code
    return read, write


def test_a_cookie_saved_before_sign_out_is_refused_after(make_client) -> None:
    client = make_client(KVNOTES_AUTH="required")
    _user()
    saved = _sign_in(client)
    csrf = _csrf(client)
    assert _reads_and_writes(client, csrf) == (200, 201)
    client.post("/logout", headers=SAME)
    thief = _browser(client, cookie=saved)
    assert _reads_and_writes(thief, csrf) == (401, 401)
    assert thief.get("/", follow_redirects=False).status_code == 303  # the pages ask to sign in again


def test_a_stranger_cannot_lock_the_owner_out(make_client) -> None:
    """100 wrong passwords from one address lock that address's tries at the account for minutes
    (the right password too), but the owner elsewhere waits at most the account's delay."""
    from data.sign_in import ADDRESS_FREE, MAX_ACCOUNT_DELAY_S, MAX_LOCK_S, PAIR_FREE

    client = make_client(KVNOTES_AUTH="required")
    _user()
    _user("bob")
    codes = [client.post("/login", data={"name": "alice", "password": f"guess-{i}"}).status_code
             for i in range(100)]
    assert codes[:PAIR_FREE] == [401] * PAIR_FREE and set(codes[PAIR_FREE:]) == {429}
    r = client.post("/login", data={"name": "alice", "password": "alice-password"}, follow_redirects=False)
    assert r.status_code == 429 and "kvnotes_session" not in r.headers.get("set-cookie", "")
    assert MAX_ACCOUNT_DELAY_S < int(r.headers["retry-after"]) <= MAX_LOCK_S
    assert "too many failed sign-ins for this account from this address; try again in" in r.text
    # the client's address is locked too (100 > ADDRESS_FREE failures): bob cannot sign in from it...
    assert 100 > ADDRESS_FREE
    r = client.post("/login", data={"name": "bob", "password": "bob-password"})
    assert r.status_code == 429 and "from this address" in r.text
    # ...but can from another address; there alice waits the account's delay at most, then signs in
    elsewhere = _browser(client, "192.0.2.9")
    assert elsewhere.post("/login", data={"name": "bob", "password": "bob-password"},
                          follow_redirects=False).status_code == 303
    owner = _browser(client, "192.0.2.10")
    r = owner.post("/login", data={"name": "alice", "password": "alice-password"}, follow_redirects=False)
    assert r.status_code == 429 and int(r.headers["retry-after"]) <= MAX_ACCOUNT_DELAY_S, r.headers
    _end_account_delay("alice")  # as MAX_ACCOUNT_DELAY_S (30 s) passing would
    r = owner.post("/login", data={"name": "alice", "password": "alice-password"}, follow_redirects=False)
    assert r.status_code == 303
    r = client.post("/login", data={"name": "alice", "password": "alice-password"})
    assert r.status_code == 429  # the stranger's address stays locked out of alice


def _end_account_delay(name: str) -> None:
    from sqlalchemy import update

    from data.db import get_sessionmaker
    from data.sign_in import LoginFailure

    with get_sessionmaker()() as s:
        s.execute(update(LoginFailure).where(LoginFailure.key == f"name:{name}").values(locked_until=None))
        s.commit()


def test_x_forwarded_for_is_trusted_only_from_the_proxies_the_operator_names(tmp_path) -> None:
    """`kvnotes serve`: a local client naming itself another address in X-Forwarded-For each time
    is still one address (the limit answers 429 after ADDRESS_FREE failures); with
    KVNOTES_TRUSTED_PROXIES=127.0.0.1 the header names the client."""
    from data.sign_in import ADDRESS_FREE

    for trusted, expected in (("", 429), ("127.0.0.1", 401)):
        codes = _rotating_guesses(tmp_path / (trusted or "none"), trusted, ADDRESS_FREE + 5)
        assert codes[:ADDRESS_FREE] == [401] * ADDRESS_FREE, codes
        assert set(codes[ADDRESS_FREE:]) == {expected}, (trusted, codes)


def _rotating_guesses(data: Path, trusted: str, n: int) -> list[int]:
    """Wrong sign-ins for n different accounts, each claiming another X-Forwarded-For address."""
    env = {**kvnotes_env(data, KVNOTES_AUTH="required", KVNOTES_TRUSTED_PROXIES=trusted),
           "PYTHONPATH": str(REPO)}
    subprocess.run([sys.executable, "-c", "from data.migrate import upgrade_to_head; upgrade_to_head()"],
                   env=env, cwd=REPO, check=True)
    assert kvnotes_cli("users", "add", "alice", "--password-stdin", env=env,
                       stdin="alice-password\n").returncode == 0
    port = free_port()
    log = (data / "serve.log").open("w")
    proc = subprocess.Popen([sys.executable, "-m", "commands.cli", "serve", "--no-worker", "--port",
                             str(port)], env=env, cwd=REPO, stdout=log, stderr=subprocess.STDOUT)
    try:
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 60
        while True:
            try:
                httpx.get(f"{url}/login", timeout=2)
                break
            except httpx.HTTPError:
                assert time.monotonic() < deadline and proc.poll() is None, (data / "serve.log").read_text()
                time.sleep(0.2)
        return [httpx.post(f"{url}/login", data={"name": f"user{i}", "password": "wrong-password"},
                           headers={"X-Forwarded-For": f"198.51.100.{i}"}, timeout=30).status_code
                for i in range(n)]
    finally:
        proc.terminate()
        proc.wait(timeout=30)
        log.close()


def test_a_success_clears_the_accounts_count(make_client) -> None:
    from data.sign_in import PAIR_FREE

    client = make_client(KVNOTES_AUTH="required")
    _user()
    for _ in range(2):  # twice: each success starts the count again, so no lock is ever reached
        for i in range(PAIR_FREE - 1):
            assert client.post("/login", data={"name": "alice", "password": f"guess-{i}"}).status_code == 401
        _sign_in(client)


def test_changing_the_password_on_the_page_ends_the_other_sessions(make_client) -> None:
    client = make_client(KVNOTES_AUTH="required")
    _user()
    other = _browser(client)
    _sign_in(other)
    other_csrf = _csrf(other)
    _sign_in(client)
    page = client.get("/account/password")
    assert page.status_code == 200 and 'name="current"' in page.text
    r = client.post("/account/password", data={"current": "nope-nope", "new": "new-password-1",
                                                "again": "new-password-1"}, headers=SAME)
    assert r.status_code == 401 and "wrong password" in r.text
    r = client.post("/account/password", data={"current": "alice-password", "new": "new-password-1",
                                                "again": "new-password-2"}, headers=SAME)
    assert r.status_code == 422 and "differ" in r.text
    r = client.post("/account/password", data={"current": "alice-password", "new": "short",
                                                "again": "short"}, headers=SAME)
    assert r.status_code == 422 and "8 to 1024 characters" in r.text
    r = client.post("/account/password", data={"current": "alice-password", "new": "new-password-1",
                                                "again": "new-password-1"}, headers=SAME)
    assert r.status_code == 200 and "1 other session(s) signed out" in r.text
    assert _reads_and_writes(other, other_csrf) == (401, 401)
    assert _reads_and_writes(client, _csrf(client)) == (200, 201)  # this session stays
    fresh = _browser(client, "192.0.2.10")
    assert fresh.post("/login", data={"name": "alice", "password": "alice-password"}).status_code == 401
    _sign_in(fresh, password="new-password-1")


def test_the_password_page_needs_a_signed_in_session(make_client) -> None:
    client = make_client()  # the embedded default: nobody signs in, nobody has a password here
    r = client.get("/account/password")
    assert r.status_code == 404 and "kvnotes users passwd" in r.text


def test_kvnotes_users_passwd_ends_every_session(make_client, tmp_path: Path) -> None:
    client = make_client(KVNOTES_AUTH="required")
    _user()
    saved = _sign_in(client)
    locked = _browser(client, "192.0.2.40")
    for i in range(12):  # someone guesses at alice's password: her account is locked for 128 s
        last = locked.post("/login", data={"name": "alice", "password": f"guess-{i}"})
    assert last.status_code == 429 and int(last.headers["retry-after"]) > 100
    env = {**os.environ, **kvnotes_env(tmp_path), "PYTHONPATH": str(REPO)}
    done = kvnotes_cli("users", "passwd", "alice", "--password-stdin", env=env, stdin="brand-new-password\n")
    assert done.returncode == 0, done.stderr
    assert done.stderr.strip() == "kvnotes: password of alice changed; 1 session(s) signed out"
    assert _browser(client, cookie=saved).get("/api/notebooks").status_code == 401
    _sign_in(_browser(client), password="brand-new-password")  # the reset also ended the lock
    done = kvnotes_cli("users", "passwd", "nobody", "--password-stdin", env=env, stdin="brand-new-password\n")
    assert done.returncode == 2 and "no user named 'nobody'" in done.stderr


def test_a_crowd_of_sign_ins_waits_for_a_hash_slot_or_is_told_to_come_back(make_client) -> None:
    from data.accounts import HASH_SLOTS, HASH_WAITERS, hash_slot

    client = make_client(KVNOTES_AUTH="required")
    _user()
    token_user = _browser(client)
    # every slot and waiting place held: the next sign-in is refused at once, the rest of the app answers
    from data import accounts

    release = threading.Event()

    def hold() -> None:
        with hash_slot():
            release.wait()

    threads = [threading.Thread(target=hold) for _ in range(HASH_SLOTS + HASH_WAITERS)]
    for thread in threads:
        thread.start()
    while accounts._admitted._value > 0:  # every place taken (the waiters wait for a slot)
        threading.Event().wait(0.01)
    r = client.post("/login", data={"name": "alice", "password": "alice-password"})
    assert r.status_code == 503 and r.headers["retry-after"] == "1" and "too many sign-ins at once" in r.text
    assert token_user.get("/login").status_code == 200
    release.set()
    for thread in threads:
        thread.join()
    # 50 at once: every one answered 401 (checked) or 503 (come back), never a 500
    with ThreadPoolExecutor(50) as pool:
        codes = list(pool.map(lambda i: _browser(client, f"192.0.2.{i + 20}").post(
            "/login", data={"name": "alice", "password": f"guess-{i}"}).status_code, range(50)))
    assert set(codes) <= {401, 429, 503} and codes.count(401) >= HASH_SLOTS, codes


def test_sessions_and_the_limit_on_postgresql(make_client, postgres_url: str) -> None:
    """The same rules on PostgreSQL (its own upsert of a failure count, its own row lock)."""
    from data.sign_in import PAIR_FREE

    client = make_client(KVNOTES_AUTH="required", DATABASE_URL=postgres_url)
    _user()
    codes = [client.post("/login", data={"name": "alice", "password": f"guess-{i}"}).status_code
             for i in range(PAIR_FREE + 2)]
    assert codes == [401] * PAIR_FREE + [429, 429]
    other = _browser(client)
    _user("bob")
    saved = _sign_in(other, "bob")
    other.post("/logout", headers=SAME)
    assert _browser(client, cookie=saved).get("/api/notebooks").status_code == 401
    from data.db import reset_engines

    reset_engines()  # let the scratch database be dropped
