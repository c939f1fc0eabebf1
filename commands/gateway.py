"""`kvnotes gateway`: the erratum gateway alone, an OpenAI-compatible endpoint in front of the user's
vLLM (or SGLang) server that turns field changes into errata so its prefix cache keeps hitting
(docs/gateway.md; the rewrite is `serving.gateway`, the HTTP side `app.gateway`).

    kvnotes gateway --upstream http://127.0.0.1:8100/v1 [--upstream URL ...] [--route base]
                    [--overload 16] [--kv-events tcp://HOST:5557 ...] [--port 8300] [--policy erratum]
                    [--notebook ID] [--check-rate 0.05] [--max-fields 4] [--timeout 120]
                    [--idle-timeout 60] [--state redis://HOST:PORT/DB] [--tenant-header NAME]
                    [--shared-key KEY ...] [--rewrite-shared]

The options become the gateway's settings (`KVNOTES_GATEWAY_*`, `data.settings`), which the web app
read too when it mounts the gateway at `/gateway/v1`; the app is served by its import string.
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


def settings_env(args) -> dict[str, str]:
    """The environment that carries the options to the app (checked first: `GatewayUsage`)."""
    from serving.server import ReplayError, base_url

    upstreams = [u.strip() for given in args.upstream for u in given.split(",") if u.strip()]
    if not upstreams:
        from data.settings import get_settings

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
        raise GatewayUsage(f"--kv-events: {len(events)} endpoints for {len(upstreams)} upstreams; give one "
                           "per --upstream, in the same order (vLLM's --kv-events-config endpoint)")
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
    env["KVNOTES_GATEWAY_SHARED_KEYS"] = ",".join(args.shared_key)
    env["KVNOTES_GATEWAY_REWRITE_SHARED"] = "1" if args.rewrite_shared else "0"
    if args.state and not args.state.startswith(("redis://", "rediss://", "unix://")):
        raise GatewayUsage(f"--state: give redis://HOST:PORT/DB, not {args.state[:80]!r}")
    if any("," in key for key in args.shared_key):
        raise GatewayUsage("--shared-key: one key per option, without commas")
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
    upstream = env["KVNOTES_GATEWAY_UPSTREAM"]
    print(f"kvnotes gateway: http://{args.host}:{args.port}/v1 -> {upstream}", flush=True)
    if not args.host.startswith("127.") and args.host not in ("localhost", "::1"):
        print("kvnotes gateway: it has no accounts: anyone who reaches this address may use the upstream; "
              "for accounts and tokens use /gateway/v1 under kvnotes serve", file=sys.stderr, flush=True)
    uvicorn.run(APP, host=args.host, port=args.port, log_config=LOG_CONFIG, log_level="info",
                timeout_graceful_shutdown=5)


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
    p.add_argument("--tenant-header", default="", metavar="NAME",
                   help="the header (set by your proxy) that names a request's tenant; a request without it "
                        "is not rewritten (default: the tenant is the API key)")
    p.add_argument("--shared-key", action="append", default=[], metavar="KEY",
                   help="an API key many clients share (repeatable): its requests are not rewritten; "
                        "placeholders such as 'unused' and 'EMPTY' always are shared")
    p.add_argument("--rewrite-shared", action="store_true",
                   help="rewrite requests with no key or a shared one too, as one tenant: only where every "
                        "client may read every other's prompts")
    p.set_defaults(func=cmd_gateway)
