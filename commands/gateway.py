"""`kvnotes gateway`: the erratum gateway alone, an OpenAI-compatible endpoint in front of the user's
vLLM (or SGLang) server that turns field changes into errata so its prefix cache keeps hitting
(docs/gateway.md; the rewrite is `serving.gateway`, the HTTP side `app.gateway`).

    kvnotes gateway --upstream http://127.0.0.1:8100/v1 [--upstream URL ...] [--route base]
                    [--overload 16] [--kv-events tcp://HOST:5557 ...] [--port 8300] [--policy erratum]
                    [--notebook ID] [--check-rate 0.05] [--max-fields 4] [--timeout 120]
                    [--idle-timeout 60] [--state redis://HOST:PORT/DB] [--keys FILE]
                    [--tenant-header NAME --trusted-proxies ADDR,NET/BITS] [--rewrite-shared]
                    [--cache-salt on|off]
    kvnotes gateway keys add TENANT --keys FILE    (prints a new key once; appends its hash)

The options become the gateway's settings (`KVNOTES_GATEWAY_*`, `data.settings`), which the web app
read too when it mounts the gateway at `/gateway/v1`; the app is served by its import string.

Bound to anything but loopback, the gateway needs proven tenants (`serving.gateway.tenants`): a key
file (`--keys`), or a tenant header taken from trusted proxies; without either it refuses to start
with one line, as `serve` refuses without a secret key. With `--state` (Redis shared by replicas) it
needs `KVNOTES_SECRET_KEY`, the one secret every replica must share: the texts kept in Redis are
sealed under it and the cache salts derived from it. uvicorn reads no `X-Forwarded-For` here: the
client's address, which `--trusted-proxies` is checked against, is the connection's.
"""

from __future__ import annotations

import argparse
import os
import sys

from serving.gateway.rewrite import LAYOUTS, PASS_THROUGH
from serving.gateway.router import OVERLOAD, ROUTES

APP = "app.gateway.main:app"
POLICIES = (*LAYOUTS, PASS_THROUGH)


class GatewayUsage(Exception):
    pass


def _share(value: str) -> float:
    number = float(value)
    if not 0 <= number <= 1:
        raise argparse.ArgumentTypeError(f"must be between 0 and 1, not {number:g}")
    return number


def _positive(value: str) -> float:
    number = float(value)
    if number <= 0:
        raise argparse.ArgumentTypeError(f"must be above 0, not {number:g}")
    return number


def _loopback(host: str) -> bool:
    from data.settings import is_loopback

    return is_loopback(host)


def settings_env(args) -> dict[str, str]:
    """The environment that carries the options to the app (checked first: `GatewayUsage`)."""
    from data.settings import get_settings
    from serving.gateway.tenants import KeyFile, trusted_networks
    from serving.server import ReplayError, base_url

    upstreams = [u.strip() for given in args.upstream for u in given.split(",") if u.strip()]
    if not upstreams:
        settings = get_settings()
        given = settings.gateway_upstream.split(",") if settings.gateway_upstream else settings.vllm_urls[:1]
        upstreams = [u.strip() for u in given if u.strip()]
    if not upstreams:
        raise GatewayUsage("give --upstream URL (or set KVNOTES_GATEWAY_UPSTREAM or KVNOTES_VLLM_URL)")
    for upstream in upstreams:
        try:
            base_url(upstream)
        except ReplayError as exc:
            raise GatewayUsage(f"--upstream: {exc}") from None
    if len(set(upstreams)) != len(upstreams):
        raise GatewayUsage("--upstream: each upstream once")
    events = [e.strip() for given in args.kv_events for e in given.split(",") if e.strip()]
    if events and len(events) != len(upstreams):
        raise GatewayUsage(f"--kv-events: {len(events)} given for {len(upstreams)} upstreams; give one "
                           "endpoint per --upstream, in the same order (vLLM's --kv-events-config endpoint)")
    bad = [e for e in events if not e.startswith(("tcp://", "ipc://"))]
    if bad:
        raise GatewayUsage(f"--kv-events: give tcp://HOST:PORT, not {bad[0][:80]!r}")
    upstream = ",".join(upstreams)
    env = {"KVNOTES_GATEWAY_UPSTREAM": upstream, "KVNOTES_GATEWAY_ENGINE": args.engine,
           "KVNOTES_GATEWAY_CHECK_RATE": str(args.check_rate),
           "KVNOTES_GATEWAY_MAX_FIELDS": str(args.max_fields),
           "KVNOTES_GATEWAY_TIMEOUT": str(args.timeout), "KVNOTES_GATEWAY_MAX_BODY": str(args.max_body),
           "KVNOTES_GATEWAY_IDLE_TIMEOUT": str(args.idle_timeout),
           "KVNOTES_GATEWAY_KEEP_PROMPTS": "1" if args.keep_prompts else "0",
           "KVNOTES_GATEWAY_ROUTE": args.route, "KVNOTES_GATEWAY_OVERLOAD": str(args.overload),
           "KVNOTES_GATEWAY_KV_EVENTS": ",".join(events)}
    env["KVNOTES_GATEWAY_STATE"] = args.state or "memory"  # standalone: no Redis unless told
    env["KVNOTES_GATEWAY_TENANT_HEADER"] = args.tenant_header
    env["KVNOTES_GATEWAY_REWRITE_SHARED"] = "1" if args.rewrite_shared else "0"
    env["KVNOTES_GATEWAY_CACHE_SALT"] = "1" if args.cache_salt == "on" else "0"
    env["KVNOTES_TRUSTED_PROXIES"] = args.trusted_proxies
    env["KVNOTES_GATEWAY_KEYS"] = os.path.abspath(args.keys) if args.keys else ""
    if args.state and not args.state.startswith(("redis://", "rediss://", "unix://")):
        raise GatewayUsage(f"--state: give redis://HOST:PORT/DB, not {args.state[:80]!r}")
    if args.state and not get_settings().secret_key:
        raise GatewayUsage("--state: set KVNOTES_SECRET_KEY, the same on every gateway sharing this Redis "
                           "(the prompts kept there are sealed under it, the cache salts derived from it)")
    try:
        proxies = trusted_networks(p for p in args.trusted_proxies.split(",") if p.strip())
    except ValueError as exc:
        raise GatewayUsage(f"--trusted-proxies: {exc}") from None
    if not _loopback(args.host) and not args.keys and not (args.tenant_header and proxies):
        raise GatewayUsage(f"serving on {args.host} needs --keys FILE (`kvnotes gateway keys add TENANT "
                           "--keys FILE` makes one), or --tenant-header with --trusted-proxies: without them "
                           "nothing tells one client from another")
    if args.tenant_header and not proxies:
        raise GatewayUsage("--tenant-header: name the proxies that set it with --trusted-proxies "
                           "(from any other address the header is refused)")
    if args.keys:
        problem = KeyFile(args.keys).check()
        if problem:
            raise GatewayUsage(f"--keys: {problem}")

    if args.policy:
        env["KVNOTES_GATEWAY_POLICY"] = args.policy
    if args.threshold is not None:
        env["KVNOTES_GATEWAY_THRESHOLD"] = str(args.threshold)
    if args.notebook is not None:
        env["KVNOTES_GATEWAY_NOTEBOOK"] = str(args.notebook)
    return env


def cmd_gateway(args) -> None:
    import uvicorn

    from commands.accounts import CommandError
    from commands.web import LOG_CONFIG

    try:
        env = settings_env(args)
    except GatewayUsage as exc:
        raise CommandError(str(exc)) from None
    os.environ.update(env)
    from data.settings import get_settings

    get_settings.cache_clear()
    if args.notebook is not None:
        _check_notebook(args.notebook)
    _check_secret()
    upstream = env["KVNOTES_GATEWAY_UPSTREAM"]
    print(f"kvnotes gateway: http://{args.host}:{args.port}/v1 -> {upstream}", flush=True)
    if not args.keys and not args.tenant_header:
        print("kvnotes gateway: no --keys: a single user's gateway on loopback (an API key is taken as the "
              "client sends it)", file=sys.stderr, flush=True)
    uvicorn.run(APP, host=args.host, port=args.port, log_config=LOG_CONFIG, log_level="info",
                timeout_graceful_shutdown=5, proxy_headers=False)


def _check_secret() -> None:
    """Settle the gateway's secret now (`data.signing`): a bad `KVNOTES_SECRET_KEY` or a key file
    that cannot be made stops the start with one line."""
    from commands.accounts import CommandError
    from data.signing import SecretKeyProblem, ensure_secret_key

    try:
        ensure_secret_key()
    except SecretKeyProblem as exc:
        raise CommandError(f"kvnotes gateway: {exc}") from None


def cmd_keys_add(args) -> None:
    """`kvnotes gateway keys add TENANT --keys FILE`: the new key on stdout, once."""
    from commands.accounts import CommandError
    from serving.gateway.tenants import KeysProblem, add_key

    try:
        key = add_key(args.keys_file, args.tenant)
    except KeysProblem as exc:
        raise CommandError(f"--keys: {exc}") from None
    except OSError as exc:
        raise CommandError(f"--keys: {args.keys_file} cannot be written ({exc.strerror or exc})") from None
    print(key, flush=True)
    print(f"kvnotes gateway: a key for {args.tenant} added to {args.keys_file} (its hash only): give it "
          "to the client now, it is not shown again; a gateway reading the file takes it at once",
          file=sys.stderr)


def _check_notebook(notebook_id: int) -> None:
    from sqlalchemy import select

    from commands.accounts import CommandError
    from data.db import get_sessionmaker
    from data.models import Notebook

    with get_sessionmaker()() as session:
        if session.scalar(select(Notebook.id).where(Notebook.id == notebook_id)) is None:
            raise CommandError(f"--notebook: notebook {notebook_id} does not exist")


def add_command(sub) -> None:
    """Register `kvnotes gateway` on the launcher's subparsers."""
    p = sub.add_parser("gateway", help="an OpenAI-compatible endpoint in front of vLLM that sends field "
                                       "changes as errata, so the prefix cache keeps hitting")
    p.add_argument("--upstream", action="append", default=[],
                   help="a serving engine, e.g. http://127.0.0.1:8100/v1; repeat it for replicas (or give "
                        "KVNOTES_GATEWAY_UPSTREAM comma-separated; default: KVNOTES_VLLM_URL): the only "
                        "places requests go")
    p.add_argument("--route", default="base", choices=ROUTES,
                   help="between replicas: base (each base to the replica its prefix is on; default), "
                        "least-loaded or round-robin")
    p.add_argument("--overload", type=float, default=OVERLOAD,
                   help=f"requests of load above the least-loaded replica past which a base moves (default "
                        f"{OVERLOAD:g})")
    p.add_argument("--kv-events", action="append", default=[], metavar="tcp://HOST:PORT",
                   help="a replica's KV-event endpoint (vLLM --kv-events-config), one per --upstream in the "
                        "same order: route by the blocks each replica says it holds")
    p.add_argument("--engine", default="vllm", choices=("vllm", "sglang"), help="the upstream's engine")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8300)
    p.add_argument("--policy", default="", choices=("",) + POLICIES,
                   help="the layout (default: the notebook's adopted sweep policy, else erratum)")
    p.add_argument("--notebook", type=int, default=None,
                   help="template mode: this notebook's document, its fields as slots named by their labels")
    p.add_argument("--check-rate", type=_share, default=0.05,
                   help="share of rewritten requests also sent unchanged and compared (default 0.05)")
    p.add_argument("--threshold", type=_share, default=None,
                   help="agreement a base must keep (default: the notebook policy's, else 0.9)")
    p.add_argument("--max-fields", type=int, default=4, help="changed spans at most, else pass-through")
    p.add_argument("--timeout", type=_positive, default=120.0,
                   help="seconds to the upstream answer's first byte (default 120)")
    p.add_argument("--idle-timeout", type=_positive, default=60.0,
                   help="seconds the upstream may send nothing in the middle of an answer (default 60); "
                        "a healthy stream has no deadline")
    p.add_argument("--max-body", type=int, default=4 << 20, help="largest request body in bytes (413 above)")
    p.add_argument("--keep-prompts", action="store_true", help="log the prompts sent (never, by default)")
    p.add_argument("--state", default="", metavar="redis://HOST:PORT/DB",
                   help="keep the bases, their errata, agreement and switches in this Redis, shared by every "
                        "gateway process given it (default: this process's memory)")
    p.add_argument("--keys", default="", metavar="FILE",
                   help="the key file: 'TENANT sha256:HEX' per line (`kvnotes gateway keys add`); a request "
                        "whose key is not listed gets 401; read again when it changes")
    p.add_argument("--tenant-header", default="", metavar="NAME",
                   help="the header (set by your proxy) that names a request's tenant, taken only from "
                        "--trusted-proxies (from anywhere else: 403)")
    p.add_argument("--trusted-proxies", default="", metavar="ADDR,NET",
                   help="addresses or networks (comma-separated) whose --tenant-header counts")
    p.add_argument("--rewrite-shared", action="store_true",
                   help="without --keys: rewrite requests with no key too, as one tenant")
    p.add_argument("--cache-salt", default="on", choices=("on", "off"),
                   help="on (default): each tenant's requests carry a cache_salt of their own, so the "
                        "engine's prefix cache never answers one tenant from another's prompts; off: tenants "
                        "share it")
    p.set_defaults(func=cmd_gateway)
    commands = p.add_subparsers(dest="gateway_command", metavar="{keys}")
    keys = commands.add_parser("keys", help="the key file of --keys")
    keys_commands = keys.add_subparsers(dest="keys_command", required=True, metavar="{add}")
    add = keys_commands.add_parser("add", help="make a random key for TENANT: printed once, its hash "
                                               "appended")
    add.add_argument("tenant", metavar="TENANT")
    add.add_argument("--keys", required=True, metavar="FILE", dest="keys_file")
    add.set_defaults(func=cmd_keys_add)
