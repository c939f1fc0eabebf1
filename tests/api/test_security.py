"""Accounts and browser protections through the real app on a real database and broker: sign-in
off only for the loopback default, 401/403 by role, API tokens, sign-in sessions (HttpOnly,
SameSite=Lax, CSRF), share links, the Host allowlist, cross-site refusal and security headers."""

from __future__ import annotations

import re

import pytest
from fastapi.testclient import TestClient

DOC = "Customer record. status: active. age: 34. Only active customers may log in."
EVIL = {"Origin": "http://evil.example"}
SAME = {"Sec-Fetch-Site": "same-origin"}


def _users(*specs: tuple[str, str]) -> dict[str, str]:
    """Users (name, role) with password `<name>-password`; returns their API tokens."""
    from data.accounts import add_user, create_token
    from data.db import get_sessionmaker

    tokens = {}
    with get_sessionmaker()() as session:
        for name, role in specs:
            add_user(session, name, f"{name}-password", role)
            tokens[name] = create_token(session, name)[1]
        session.commit()
    return tokens


def _bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def _other_client(client: TestClient, host: str) -> TestClient:
    return TestClient(client.app, base_url="http://127.0.0.1", client=(host, 50000))


def test_the_loopback_default_needs_no_sign_in_but_a_remote_client_does(make_client) -> None:
    client = make_client()
    assert client.get("/api/notebooks").status_code == 200
    assert client.post("/api/notebooks", json={"title": "t", "text": DOC}).json()["created_by"] == "local"
    remote = _other_client(client, "192.0.2.7")
    r = remote.get("/api/notebooks")
    assert r.status_code == 401 and r.headers["www-authenticate"] == "Bearer"
    assert remote.get("/", follow_redirects=False).headers["location"] == "/login?next=/"


def test_tokens_and_roles(make_client) -> None:
    client = make_client(KVNOTES_AUTH="required")
    tokens = _users(("alice", "editor"), ("vera", "viewer"))
    assert client.get("/api/notebooks").status_code == 401
    assert client.get("/api/notebooks", headers=_bearer("kvn_wrong")).status_code == 401
    r = client.post("/api/notebooks", json={"title": "t", "text": DOC}, headers=_bearer(tokens["alice"]))
    assert r.status_code == 201 and r.json()["created_by"] == "alice"
    nb = r.json()["id"]
    assert client.get(f"/api/notebooks/{nb}", headers=_bearer(tokens["vera"])).status_code == 200
    r = client.patch(f"/api/notebooks/{nb}", json={"title": "x"}, headers=_bearer(tokens["vera"]))
    assert r.status_code == 403 and "viewer" in r.json()["detail"]
    r = client.post("/api/skills", json={"name": "s", "text": "Be brief."}, headers=_bearer(tokens["alice"]))
    assert r.json()["created_by"] == "alice"
    from data.accounts import list_tokens, revoke_token
    from data.db import get_sessionmaker

    with get_sessionmaker()() as session:
        used = {t.user.name: t.last_used_at is not None for t in list_tokens(session)}
        assert used == {"alice": True, "vera": True}
        revoke_token(session, "alice")
        session.commit()
    assert client.get("/api/notebooks", headers=_bearer(tokens["alice"])).status_code == 401
    assert client.get("/api/health").status_code in (200, 503)  # public: probes need no token


def test_sign_in_session_cookie_csrf_and_sign_out(make_client) -> None:
    client = make_client(KVNOTES_AUTH="required")
    _users(("alice", "editor"))
    location = client.get("/notebooks/1", follow_redirects=False).headers["location"]
    assert location == "/login?next=/notebooks/1"
    r = client.post("/login", data={"name": "alice", "password": "nope-nope", "next": "/"})
    assert r.status_code == 401 and "wrong name or password" in r.text
    r = client.post("/login", data={"name": "alice", "password": "alice-password", "next": "//evil.example/"},
                    follow_redirects=False)
    assert r.status_code == 303 and r.headers["location"] == "/"  # never off-site after sign-in
    cookie = r.headers["set-cookie"]
    assert "kvnotes_session=" in cookie and "HttpOnly" in cookie and "SameSite=lax" in cookie
    assert "Secure" not in cookie  # plain http on loopback; KVNOTES_HTTPS=1 adds it
    page = client.get("/").text
    assert "alice · editor" in page
    csrf = re.search(r'"X-CSRF-Token": "([^"]+)"', page).group(1)
    # a session request with no browser headers must carry the token; a browser's same-origin one passes
    r = client.post("/api/notebooks", json={"title": "t", "text": DOC})
    assert r.status_code == 403 and "CSRF" in r.json()["detail"]
    r = client.post("/api/notebooks", json={"title": "t", "text": DOC}, headers={"X-CSRF-Token": csrf})
    assert r.status_code == 201 and r.json()["created_by"] == "alice"
    r = client.post("/api/notebooks", json={"title": "t", "text": DOC}, headers=SAME)
    assert r.status_code == 201
    r = client.post("/notebooks", data={"title": "x", "model": "smollm2-135m", "text": DOC}, headers=EVIL)
    assert r.status_code == 403
    client.post("/logout", headers={"Origin": "http://127.0.0.1"})
    assert client.get("/", follow_redirects=False).status_code == 303


def test_secure_cookie_behind_https(make_client) -> None:
    client = make_client(KVNOTES_AUTH="required", KVNOTES_HTTPS="1")
    _users(("alice", "editor"))
    r = client.post("/login", data={"name": "alice", "password": "alice-password"}, follow_redirects=False)
    assert "Secure" in r.headers["set-cookie"]
    assert r.headers["strict-transport-security"].startswith("max-age=")


def test_share_links_show_one_run_until_revoked(make_client) -> None:
    client = make_client(KVNOTES_AUTH="required")
    tokens = _users(("alice", "editor"))
    alice = _bearer(tokens["alice"])
    nb = client.post("/api/notebooks", json={"title": "t", "text": DOC}, headers=alice).json()["id"]
    runs = [client.post(f"/api/notebooks/{nb}/runs", json={"question": "Log in?"}, headers=alice).json()["id"]
            for _ in range(2)]
    share = client.post(f"/api/runs/{runs[0]}/shares", headers=alice).json()
    assert share["url"].startswith("/share/") and share["created_by"] == "alice"

    visitor = TestClient(client.app, base_url="http://127.0.0.1", client=("127.0.0.1", 50001))
    r = visitor.get(share["url"], follow_redirects=False)
    assert r.status_code == 303 and r.headers["location"] == f"/runs/{runs[0]}"
    assert visitor.get(f"/runs/{runs[0]}").status_code == 200
    assert visitor.get(f"/api/runs/{runs[0]}").json()["id"] == runs[0]
    assert visitor.get(f"/api/runs/{runs[1]}").status_code == 401  # only the shared run
    assert visitor.get(f"/api/runs/{runs[0]}/shares").status_code == 401
    assert visitor.get("/api/notebooks").status_code == 401
    assert visitor.post(f"/api/runs/{runs[0]}/cancel").status_code == 401
    assert visitor.get(share["url"][:-3] + "abc").status_code == 404  # a forged signature
    assert client.delete(f"/api/shares/{share['id']}", headers=alice).status_code == 204
    assert visitor.get(f"/runs/{runs[0]}", follow_redirects=False).status_code == 303  # revoked: sign in
    # the run page's button: a link made and revoked from the page (an editor's session)
    client.post("/login", data={"name": "alice", "password": "alice-password"})
    fragment = client.post(f"/runs/{runs[1]}/share", headers={"HX-Request": "true", **SAME}).text
    url = re.search(r'value="http://127.0.0.1/(share/[^"]+)"', fragment).group(1)
    assert visitor.get("/" + url, follow_redirects=False).headers["location"] == f"/runs/{runs[1]}"
    assert visitor.get(f"/runs/{runs[1]}").status_code == 200
    share_id = re.search(r'/shares/(\d+)/revoke', fragment).group(1)
    client.post(f"/shares/{share_id}/revoke", headers={"Sec-Fetch-Site": "same-origin"})
    assert visitor.get(f"/runs/{runs[1]}", follow_redirects=False).status_code == 303


def test_cross_site_requests_foreign_hosts_and_security_headers(make_client) -> None:
    client = make_client()  # the embedded default: protected though nobody signs in
    nb = client.post("/api/notebooks", json={"title": "t", "text": DOC}).json()["id"]
    r = client.post("/api/notebooks", json={"title": "t", "text": DOC}, headers=EVIL)
    assert r.status_code == 403 and "evil.example" in r.json()["detail"]
    r = client.post(f"/notebooks/{nb}/errata", data={"text": "x"}, headers={"Sec-Fetch-Site": "cross-site"})
    assert r.status_code == 403
    other_port = {"Origin": "http://127.0.0.1:8000"}
    assert client.delete(f"/api/notebooks/{nb}", headers=other_port).status_code == 403
    assert client.post(f"/notebooks/{nb}/errata", data={"text": "ok"},
                       headers={"Origin": "http://127.0.0.1", **SAME}).status_code == 200
    r = client.get("/api/notebooks", headers={"Host": "evil.example"})
    assert r.status_code == 400 and "KVNOTES_ALLOWED_HOSTS" in r.json()["detail"]
    assert client.get("/", headers={"Host": "localhost:8000"}).status_code == 200
    for path in ("/", f"/notebooks/{nb}", "/api/notebooks", "/static/css/kvnotes.css"):
        headers = client.get(path).headers
        csp = headers["content-security-policy"]
        script_src = csp.split("script-src")[1].split(";")[0]
        assert "frame-ancestors 'none'" in csp and "script-src 'self'" in csp
        assert "unsafe-inline" not in script_src
        assert headers["x-content-type-options"] == "nosniff" and headers["referrer-policy"] == "same-origin"


def test_allowed_hosts_can_be_configured(make_client) -> None:
    client = make_client(KVNOTES_ALLOWED_HOSTS="notes.example.com,*.corp.example")
    assert client.get("/api/notebooks", headers={"Host": "notes.example.com"}).status_code == 200
    assert client.get("/api/notebooks", headers={"Host": "a.corp.example"}).status_code == 200
    assert client.get("/api/notebooks").status_code == 400  # 127.0.0.1 is no longer listed


@pytest.mark.parametrize("role", ["viewer", "editor"])
def test_a_viewer_cannot_use_the_pages_to_change_anything(make_client, role: str) -> None:
    client = make_client(KVNOTES_AUTH="required")
    _users(("pat", role))
    client.post("/login", data={"name": "pat", "password": "pat-password"})
    r = client.post("/notebooks", data={"title": "t", "model": "smollm2-135m", "text": DOC},
                    headers={"Sec-Fetch-Site": "same-origin"}, follow_redirects=False)
    assert r.status_code == (403 if role == "viewer" else 303)


# ---- cross-site edges (issue 19, finding 10) --------------------------------------------------------


def test_a_malformed_bearer_header_is_refused_not_skipped_to_the_cookie(make_client) -> None:
    client = make_client(KVNOTES_AUTH="required")
    _users(("alice", "editor"))
    client.post("/login", data={"name": "alice", "password": "alice-password"})
    body = {"title": "t", "text": DOC}
    for header in (b"Bearer \xa0", b"Bearer ", b"bearer", b"Bearer  kvn_x y", b"Bearer\xa0kvn_abc"):
        r = client.post("/api/notebooks", json=body, headers={"Authorization": header, **EVIL})
        assert r.status_code == 401 and "malformed" in r.json()["detail"], (header, r.status_code, r.text)
        r = client.get("/api/notebooks", headers={"Authorization": header})
        assert r.status_code == 401, header  # a read too: never the cookie instead
    # another scheme (a proxy's Basic) is not a token: the session and its cross-site checks apply as before
    r = client.post("/api/notebooks", json=body, headers={"Authorization": "Basic YTpi", **EVIL})
    assert r.status_code == 403
    basic = {"Authorization": "Basic YTpi", "Sec-Fetch-Site": "same-origin"}
    r = client.post("/api/notebooks", json=body, headers=basic)
    assert r.status_code == 201


def test_only_same_origin_fetch_metadata_passes_an_unsafe_request(make_client) -> None:
    client = make_client()  # the embedded default: no token, no sign-in, no CSRF token to fall back on
    body = {"title": "t", "text": DOC}
    for site in ("none", "garbage", "", "same-origin, cross-site"):
        r = client.post("/api/notebooks", json=body, headers={"Sec-Fetch-Site": site})
        assert r.status_code == 403 and "Sec-Fetch-Site" in r.json()["detail"], site
    assert client.post("/api/notebooks", json=body, headers=SAME).status_code == 201
    assert client.get("/api/notebooks", headers={"Sec-Fetch-Site": "none"}).status_code == 200  # reads pass


def test_an_https_origin_is_not_the_same_origin_as_plain_http(make_client) -> None:
    client = make_client()
    body = {"title": "t", "text": DOC}
    for origin in ("https://127.0.0.1", "https://127.0.0.1:80", "https://127.0.0.1:443"):
        r = client.post("/api/notebooks", json=body, headers={"Origin": origin})
        assert r.status_code == 403 and "is not this site" in r.json()["detail"], origin
    assert client.post("/api/notebooks", json=body, headers={"Origin": "http://127.0.0.1"}).status_code == 201
    https = make_client(KVNOTES_HTTPS="1")  # behind TLS it is the other way round
    assert https.post("/api/notebooks", json=body, headers={"Origin": "http://127.0.0.1"}).status_code == 403
    assert https.post("/api/notebooks", json=body, headers={"Origin": "https://127.0.0.1"}).status_code == 201


def test_two_host_headers_are_refused(make_client) -> None:
    client = make_client()
    r = client.get("/api/notebooks", headers=[("Host", "127.0.0.1"), ("Host", "evil.example")])
    assert r.status_code == 400 and "more than one Host" in r.json()["detail"]


def test_two_origin_or_sec_fetch_site_headers_are_refused(make_client) -> None:
    """Read first-wins, a same-origin first value would hide a cross-site second one."""
    client = make_client()
    body = {"title": "t", "text": DOC}
    for name, first, second in (("Origin", "http://127.0.0.1", "https://evil.example"),
                                ("Sec-Fetch-Site", "same-origin", "cross-site")):
        r = client.post("/api/notebooks", json=body, headers=[(name, first), (name, second)])
        assert r.status_code == 400 and f"more than one {name} header" in r.json()["detail"], r.text
        assert client.post("/api/notebooks", json=body, headers=[(name, first)]).status_code == 201
    assert len(client.get("/api/notebooks").json()) == 2


def test_answers_are_not_stored_by_caches_but_static_files_are(make_client) -> None:
    client = make_client(KVNOTES_AUTH="required")
    tokens = _users(("alice", "editor"))
    client.post("/login", data={"name": "alice", "password": "alice-password"})
    for path in ("/", "/api/notebooks", "/skills"):
        assert client.get(path).headers["cache-control"] == "no-store", path
    by_token = client.get("/api/notebooks", headers=_bearer(tokens["alice"]))
    assert by_token.headers["cache-control"] == "no-store"
    assert "no-store" not in client.get("/static/css/kvnotes.css").headers.get("cache-control", "")


# ---- the secret key and the files that hold secrets (findings 7 and 11) ------------------------------


def test_a_guessable_secret_key_is_refused_at_start(make_client) -> None:
    from data.signing import SecretKeyProblem

    for key in ("short", "ab" * 20, "abcdefghijklmnopqrstuvwxyz0123456789", "a" * 32):
        with pytest.raises(SecretKeyProblem, match="KVNOTES_SECRET_KEY"):
            make_client(KVNOTES_SECRET_KEY=key)
    from commands.serve import startup_problem

    assert "guessable" in startup_problem()  # `kvnotes serve` says it in one line, exit 2
    make_client(KVNOTES_SECRET_KEY="Vq3xR8mZ2pLw9TfK7cYb4NhJ6sGd1EaU5oXi0QrW")  # a random one starts


def test_a_read_only_data_folder_without_a_key_stops_the_start_not_a_sign_in(make_client, tmp_path) -> None:
    import subprocess

    from data.signing import SecretKeyProblem

    folder = tmp_path / "read-only"
    folder.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "ro,size=1m", "tmpfs", str(folder)]).returncode != 0:
        pytest.skip("cannot mount a read-only tmpfs here (root only)")
    try:
        problem = r"key file .*read-only/secret_key cannot be made .*KVNOTES_SECRET_KEY"
        with pytest.raises(SecretKeyProblem, match=problem):
            make_client(KVNOTES_AUTH="required", KVNOTES_DATA=str(folder))
        from commands.serve import startup_problem

        assert "cannot be made" in startup_problem()
        client = make_client(KVNOTES_AUTH="required", KVNOTES_DATA=str(folder),
                             KVNOTES_SECRET_KEY="Vq3xR8mZ2pLw9TfK7cYb4NhJ6sGd1EaU5oXi0QrW")
        _users(("alice", "editor"))
        r = client.post("/login", data={"name": "alice", "password": "alice-password"},
                        follow_redirects=False)
        assert r.status_code == 303
    finally:
        subprocess.run(["umount", "-l", str(folder)], check=False)


def test_the_data_folder_and_the_embedded_broker_and_results_are_their_owners_only(make_client,
                                                                                  tmp_path) -> None:
    tmp_path.chmod(0o755)  # a folder left open by an older version
    client = make_client()
    assert client.post("/api/notebooks", json={"title": "t", "text": DOC}).status_code == 201
    assert oct(tmp_path.stat().st_mode & 0o777) == "0o700"
    modes = {name: oct((tmp_path / name).stat().st_mode & 0o777) for name in ("broker.db", "results.db")}
    assert modes == {"broker.db": "0o600", "results.db": "0o600"}, modes


def test_an_empty_kvnotes_data_means_the_default_folder(monkeypatch, tmp_path) -> None:
    from data.settings import CHECKOUT_DATA_DIR, Settings

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("KVNOTES_DATA", "")
    assert Settings().data_dir == CHECKOUT_DATA_DIR.resolve() != tmp_path.resolve()
    monkeypatch.setenv("KVNOTES_DATA", "  ")
    assert Settings().data_dir == CHECKOUT_DATA_DIR.resolve()


def test_the_database_and_the_key_file_are_readable_by_their_owner_only(make_client, tmp_path) -> None:
    make_client()
    assert oct((tmp_path / "kvnotes.db").stat().st_mode & 0o777) == "0o600"
    assert oct((tmp_path / "secret_key").stat().st_mode & 0o777) == "0o600"
    for name in ("kvnotes.db", "secret_key"):
        (tmp_path / name).chmod(0o644)  # left readable by an older version
    from data.signing import _key

    _key.cache_clear()
    make_client()
    assert {oct((tmp_path / n).stat().st_mode & 0o777) for n in ("kvnotes.db", "secret_key")} == {"0o600"}
