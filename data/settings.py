"""One place for configuration: the data folder, the database / broker / result-backend URLs, the
models offered, every input limit the API enforces, and the worker's device and time limits. Every
environment variable the web app or the worker reads is a field here.

Read from the environment (explicit names, no prefix) by pydantic-settings. Every URL defaults to a
SQLite file under the data folder, so `kvnotes serve` runs with nothing else installed; production
sets `DATABASE_URL` (PostgreSQL) and `BROKER_URL` / `RESULT_BACKEND` (Redis or RabbitMQ).
"""

from __future__ import annotations

import ipaddress
import os
import re
from functools import lru_cache
from pathlib import Path
from typing import Literal

from pydantic import Field, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict
from sqlalchemy.engine import make_url

# The default data folder: `var/` in the checkout, whatever the working directory, so `scripts/run.sh`
# (which serves from the checkout) and `kvnotes` typed anywhere share one database and one converted model.
CHECKOUT_DATA_DIR = Path(__file__).resolve().parents[1] / "var"


class Settings(BaseSettings):
    model_config = SettingsConfigDict(extra="ignore", populate_by_name=True)

    data_dir: Path = Field(default=CHECKOUT_DATA_DIR, validation_alias="KVNOTES_DATA")
    database_url: str = Field(default="", validation_alias="DATABASE_URL")
    broker_url: str = Field(default="", validation_alias="BROKER_URL")
    result_backend: str = Field(default="", validation_alias="RESULT_BACKEND")
    default_model: str = Field(default="smollm2-135m", validation_alias="KVNOTES_DEFAULT_MODEL")
    models_csv: str = Field(default="smollm2-135m,gemma3-270m", validation_alias="KVNOTES_MODELS")

    # Limits: the API answers 422 naming the field and the limit when one is exceeded.
    max_document_chars: int = Field(default=200_000, validation_alias="KVNOTES_MAX_DOCUMENT_CHARS")
    max_document_tokens: int = Field(default=8192, validation_alias="KVNOTES_MAX_DOCUMENT_TOKENS")
    max_upload_bytes: int = Field(default=1 << 20, validation_alias="KVNOTES_MAX_UPLOAD_BYTES")
    max_fields: int = Field(default=32, validation_alias="KVNOTES_MAX_FIELDS")
    max_errata: int = Field(default=32, validation_alias="KVNOTES_MAX_ERRATA")
    max_placements: int = Field(default=32, validation_alias="KVNOTES_MAX_PLACEMENTS")
    max_choices: int = Field(default=16, validation_alias="KVNOTES_MAX_CHOICES")
    max_question_chars: int = Field(default=2_000, validation_alias="KVNOTES_MAX_QUESTION_CHARS")
    max_label_chars: int = Field(default=200, validation_alias="KVNOTES_MAX_LABEL_CHARS")
    max_value_chars: int = Field(default=2_000, validation_alias="KVNOTES_MAX_VALUE_CHARS")
    max_skill_chars: int = Field(default=20_000, validation_alias="KVNOTES_MAX_SKILL_CHARS")
    max_erratum_chars: int = Field(default=5_000, validation_alias="KVNOTES_MAX_ERRATUM_CHARS")
    max_title_chars: int = Field(default=200, validation_alias="KVNOTES_MAX_TITLE_CHARS")

    # The serving replay (docs/serving.md): the OpenAI-compatible vLLM servers replays may reach, one
    # URL or several separated by commas (the first is the default), and the model ("" = the one model
    # the server serves), the defaults of `kvnotes replay` and the notebook's Serving panel. A replay
    # started on the web reaches only these, except on the embedded default (no accounts, loopback).
    vllm_url: str = Field(default="", validation_alias="KVNOTES_VLLM_URL")
    vllm_model: str = Field(default="", validation_alias="KVNOTES_VLLM_MODEL")
    # A replay's bounds: in all, and for each answer of its server the silence it waits through while
    # the server shows no progress either (`serving.server.Server`; seconds).
    replay_deadline_s: float = Field(default=900.0, gt=0, validation_alias="KVNOTES_REPLAY_DEADLINE")
    replay_request_s: float = Field(default=120.0, gt=0, validation_alias="KVNOTES_REPLAY_REQUEST_TIMEOUT")
    # replays served at once by a replays worker (threads: a replay is HTTP calls, not model work)
    replay_threads: int = Field(default=4, ge=1, le=64, validation_alias="KVNOTES_REPLAY_THREADS")

    # The erratum gateway (`kvnotes gateway`, and `/gateway/v1` in `kvnotes serve`; docs/gateway.md):
    # the upstreams it forwards to (comma-separated replicas; "" = the first KVNOTES_VLLM_URL) and their
    # engine, how it routes between them (base, least-loaded, round-robin), the load above the least
    # loaded past which a base moves, the replicas' KV-event endpoints (comma-separated, in the
    # upstreams' order; "" = none), the layout
    # ("" = the notebook's adopted policy, else erratum), the template notebook, the limits, the
    # share of rewritten requests checked, the agreement threshold ("0" = the policy's, else 0.9),
    # the bound on each upstream answer, the largest body, and whether prompts may be logged.
    gateway_upstream: str = Field(default="", validation_alias="KVNOTES_GATEWAY_UPSTREAM")
    gateway_engine: str = Field(default="vllm", validation_alias="KVNOTES_GATEWAY_ENGINE")
    gateway_route: str = Field(default="base", validation_alias="KVNOTES_GATEWAY_ROUTE")
    gateway_overload: float = Field(default=16.0, ge=0, validation_alias="KVNOTES_GATEWAY_OVERLOAD")
    gateway_kv_events: str = Field(default="", validation_alias="KVNOTES_GATEWAY_KV_EVENTS")
    gateway_policy: str = Field(default="", validation_alias="KVNOTES_GATEWAY_POLICY")
    gateway_notebook: int | None = Field(default=None, validation_alias="KVNOTES_GATEWAY_NOTEBOOK")
    gateway_max_fields: int = Field(default=4, ge=1, validation_alias="KVNOTES_GATEWAY_MAX_FIELDS")
    gateway_check_rate: float = Field(default=0.05, ge=0, le=1, validation_alias="KVNOTES_GATEWAY_CHECK_RATE")
    gateway_threshold: float = Field(default=0.0, ge=0, le=1, validation_alias="KVNOTES_GATEWAY_THRESHOLD")
    gateway_timeout_s: float = Field(default=120.0, gt=0, validation_alias="KVNOTES_GATEWAY_TIMEOUT")
    # the longest silence between two pieces of an upstream's answer (its first byte: gateway_timeout_s)
    gateway_idle_timeout_s: float = Field(default=60.0, gt=0, validation_alias="KVNOTES_GATEWAY_IDLE_TIMEOUT")
    gateway_max_body: int = Field(default=4 << 20, gt=0, validation_alias="KVNOTES_GATEWAY_MAX_BODY")
    gateway_keep_prompts: bool = Field(default=False, validation_alias="KVNOTES_GATEWAY_KEEP_PROMPTS")
    gateway_seed: int | None = Field(default=None, validation_alias="KVNOTES_GATEWAY_SEED")
    # the gateway's shared state (redis://HOST:PORT/DB; "" = this process's memory, or under `serve` with
    # several web processes the broker's Redis) and its tenants (serving/gateway/tenants.py)
    gateway_state: str = Field(default="", validation_alias="KVNOTES_GATEWAY_STATE")
    # the key file (`TENANT sha256:HEX` lines; "" = none), the tenant header (taken only from
    # KVNOTES_TRUSTED_PROXIES), and whether each tenant's requests carry a cache salt of their own
    gateway_keys: str = Field(default="", validation_alias="KVNOTES_GATEWAY_KEYS")
    gateway_tenant_header: str = Field(default="", validation_alias="KVNOTES_GATEWAY_TENANT_HEADER")
    gateway_cache_salt: bool = Field(default=True, validation_alias="KVNOTES_GATEWAY_CACHE_SALT")
    gateway_rewrite_shared: bool = Field(default=False, validation_alias="KVNOTES_GATEWAY_REWRITE_SHARED")
    # the gateway's own request slots in each process (app/gateway/slots.py): in all, and per tenant (a
    # signed-in user under `serve`); past them 429 at once. They never take the web app's slots.
    gateway_slots: int = Field(default=128, ge=1, validation_alias="KVNOTES_GATEWAY_SLOTS")
    gateway_slots_per_user: int = Field(default=32, ge=1, validation_alias="KVNOTES_GATEWAY_SLOTS_PER_USER")

    # A run whose worker has sent no heartbeat for this long is marked failed (the watchdog).
    heartbeat_max_age_s: float = Field(default=120.0, validation_alias="KVNOTES_HEARTBEAT_MAX_AGE")

    # How long the web process waits for the broker before answering 503.
    broker_connect_timeout_s: float = Field(default=3.0, validation_alias="KVNOTES_BROKER_TIMEOUT")
    # How often a worker polls a broker that cannot push (the embedded SQLAlchemy broker; kombu's
    # default is once a second, which a run then waits half of on average). Redis pushes.
    broker_poll_interval_s: float = Field(
        default=0.05, gt=0, le=5, validation_alias="KVNOTES_BROKER_POLL_INTERVAL"
    )

    # The worker: the torch device it loads models on ("" = CUDA when available, else the CPU), how
    # long one task may run, and (Redis only) after how long an unacknowledged message is delivered
    # again (0 = the time limit + 60 s).
    device: str = Field(default="", validation_alias="KVNOTES_DEVICE")
    # What the worker and the command line compute in ("" = bfloat16 on CUDA, float32 on the CPU);
    # a run's report names it, and the KV store keeps notes of each dtype apart.
    dtype: Literal["", "float32", "bfloat16", "float16"] = Field(default="", validation_alias="KVNOTES_DTYPE")
    # With KVNOTES_DEVICE=auto (a model spread over the GPUs): what each device may hold,
    # "0=70GiB,1=70GiB,cpu=200GiB" ("" = accelerate's estimate); a model that does not fit is refused.
    max_memory: str = Field(default="", validation_alias="KVNOTES_MAX_MEMORY")
    # The KV store's shared tier (issue 40): s3://BUCKET/PREFIX ("" = the local folder only), the S3
    # endpoint ("" = AWS; credentials from AWS_*), its byte budget (evicted least-recently-used), the
    # Redis URL of its index ("" = the broker's when it is Redis) and the per-request timeout.
    store_url: str = Field(default="", pattern=r"^(s3://[a-z0-9][a-z0-9.-]{2,62}(/.*)?)?$",
                           validation_alias="KVNOTES_STORE_URL")
    s3_endpoint: str = Field(default="", validation_alias="KVNOTES_S3_ENDPOINT")
    store_shared_bytes: int = Field(default=64 * 2**30, gt=0, validation_alias="KVNOTES_STORE_SHARED_BYTES")
    store_index_url: str = Field(default="", validation_alias="KVNOTES_STORE_INDEX")
    store_timeout_s: float = Field(default=5.0, gt=0, validation_alias="KVNOTES_STORE_TIMEOUT")
    # Whose notes a lookup may read: "deployment" (every run's, the default: one prefill serves every
    # user) or "user" (keys salted per user: no user learns through store_reuse or timing what
    # another prefilled; each user prefills a document once)
    store_scope: Literal["deployment", "user"] = Field(default="deployment",
                                                       validation_alias="KVNOTES_STORE_SCOPE")
    # The shared tier's upload queue, in bytes (beyond it an upload is dropped, counted)
    store_upload_bytes: int = Field(default=512 * 2**20, gt=0, validation_alias="KVNOTES_STORE_UPLOAD_BYTES")
    task_time_limit_s: int = Field(default=3600, ge=1, validation_alias="KVNOTES_TASK_TIME_LIMIT")
    # How long a running job may run before it is failed and its worker freed (`data.jobs.deadline_s`):
    # seconds for every kind, and/or per kind where they differ: "3600", "trajectory=600",
    # "3600,replay=900" ("" = KVNOTES_TASK_TIME_LIMIT; a replay, KVNOTES_REPLAY_DEADLINE).
    job_deadline: str = Field(default="", validation_alias="KVNOTES_JOB_DEADLINE_S")
    visibility_timeout_s: int = Field(default=0, ge=0, validation_alias="KVNOTES_VISIBILITY_TIMEOUT")

    # Security (README "Security"). Sign-in is off only for a loopback client of a loopback bind
    # (the embedded default) unless `KVNOTES_AUTH=required`; any other bind needs a secret key and a
    # user (`kvnotes serve` refuses to start without them). The secret signs session cookies, CSRF
    # tokens and share links; on loopback without one, a key file under the data folder is used.
    secret_key: str = Field(default="", validation_alias="KVNOTES_SECRET_KEY")
    auth: Literal["auto", "required"] = Field(default="auto", validation_alias="KVNOTES_AUTH")
    bind_host: str = Field(default="127.0.0.1", validation_alias="KVNOTES_BIND_HOST")  # set by `serve`
    allowed_hosts_csv: str = Field(default="", validation_alias="KVNOTES_ALLOWED_HOSTS")
    # Proxies whose X-Forwarded-For names the client (addresses or networks, comma-separated; "" =
    # none: the client is the connection's peer, whatever a header says); for `kvnotes gateway`
    # (`--trusted-proxies`), the proxies whose tenant header counts.
    trusted_proxies_csv: str = Field(default="", validation_alias="KVNOTES_TRUSTED_PROXIES")
    # served behind TLS: Secure cookies, HSTS
    https: bool = Field(default=False, validation_alias="KVNOTES_HTTPS")
    session_max_age_s: int = Field(default=14 * 86400, ge=60, validation_alias="KVNOTES_SESSION_MAX_AGE")

    # Work limits: queued + running runs per user, and in all (beyond them: 429 with the reason).
    max_active_runs_per_user: int = Field(
        default=8, ge=1, validation_alias="KVNOTES_MAX_ACTIVE_RUNS_PER_USER"
    )
    max_active_runs: int = Field(default=64, ge=1, validation_alias="KVNOTES_MAX_ACTIVE_RUNS")
    # Sweeps: edits per sweep, and queued + running sweeps per user (a sweep's edits are runs the run
    # caps above do not count: they queue behind other runs instead, at a lower priority).
    max_sweep_edits: int = Field(default=200, ge=1, validation_alias="KVNOTES_MAX_SWEEP_EDITS")
    max_active_sweeps_per_user: int = Field(
        default=2, ge=1, validation_alias="KVNOTES_MAX_ACTIVE_SWEEPS_PER_USER"
    )
    # Trajectories: turns per trajectory (each turn runs every strategy's readout once).
    max_turns: int = Field(default=64, ge=1, validation_alias="KVNOTES_MAX_TURNS")
    # A worker whose beat is older than this is dead (health says so; its runs are failed).
    worker_stale_s: float = Field(default=30.0, gt=0, validation_alias="KVNOTES_WORKER_STALE_S")
    # Capacity of one web process: database connections, which is also how many requests it serves
    # at once; how many more may wait for one, and for how long. Beyond that: 503 with Retry-After at
    # once (never a 500 after a 30 s pool timeout). /api/health has connections of its own.
    db_pool_size: int = Field(default=8, ge=1, le=200, validation_alias="KVNOTES_DB_POOL_SIZE")
    # SQLite's journal (`data.db`): "delete", a rollback journal, maps no shared memory, so storage that
    # takes the files away gives 503s, never a SIGBUS; "wal" reads beside a writer faster (docs/load.md)
    sqlite_journal: Literal["delete", "wal"] = Field(default="delete",
                                                     validation_alias="KVNOTES_SQLITE_JOURNAL")
    request_queue: int = Field(default=256, ge=0, validation_alias="KVNOTES_REQUEST_QUEUE")
    request_wait_s: float = Field(default=15.0, gt=0, validation_alias="KVNOTES_REQUEST_WAIT_S")
    # Heavy renders of a run (its report, exports, painted attention views) built at once, per signed-in
    # user and per shared run, in each web process; beyond it 503 with Retry-After. A finished run's
    # renders are built once and stored, so only the first request of each pays.
    max_heavy_renders: int = Field(default=2, ge=1, le=64, validation_alias="KVNOTES_MAX_HEAVY_RENDERS")
    # Set by `kvnotes serve` for the worker it starts: the worker dies with this process.
    supervisor_pid: int = Field(default=0, ge=0, validation_alias="KVNOTES_SUPERVISOR_PID")

    @field_validator("job_deadline")
    @classmethod
    def _deadlines(cls, value: str) -> str:
        job_deadlines(value)  # refused at start, naming the part that is wrong
        return value

    @property
    def job_deadlines_s(self) -> dict[str, float]:
        """`KVNOTES_JOB_DEADLINE_S` by kind name ("*": every kind not named)."""
        return job_deadlines(self.job_deadline)

    @field_validator("data_dir", mode="before")
    @classmethod
    def _default_when_empty(cls, value: object) -> object:
        """`KVNOTES_DATA=` (set but empty) means the default folder, not the working directory."""
        return CHECKOUT_DATA_DIR if isinstance(value, str) and not value.strip() else value

    @field_validator("data_dir")
    @classmethod
    def _absolute(cls, value: Path) -> Path:
        return value.expanduser().resolve()

    @model_validator(mode="after")
    def _defaults_under_data_dir(self) -> Settings:
        data = self.data_dir.as_posix()
        if not self.database_url:
            self.database_url = f"sqlite:///{data}/kvnotes.db"
        if not self.broker_url:
            self.broker_url = f"sqla+sqlite:///{data}/broker.db"
        if not self.result_backend:
            self.result_backend = f"db+sqlite:///{data}/results.db"
        return self

    @property
    def trusted_proxies(self) -> list[str]:
        return [p.strip() for p in self.trusted_proxies_csv.split(",") if p.strip()]

    @property
    def proxy_options(self) -> dict[str, object]:
        """uvicorn's options for X-Forwarded-For: read only from `KVNOTES_TRUSTED_PROXIES` (uvicorn's
        own default trusts 127.0.0.1, so any local client could name itself any address)."""
        proxies = self.trusted_proxies
        return {"proxy_headers": bool(proxies), "forwarded_allow_ips": ",".join(proxies) or ""}

    @property
    def vllm_urls(self) -> list[str]:
        """The vLLM servers of `KVNOTES_VLLM_URL`, the default first."""
        return [u.strip() for u in self.vllm_url.split(",") if u.strip()]

    @property
    def service_ports(self) -> list[int]:
        """The ports of the database, the broker and the result backend (a replay never reaches one)."""
        ports = []
        for url in (self.database_url, self.broker_url, self.result_backend):
            try:
                port = make_url(url.replace("sqla+", "", 1)).port
            except Exception:  # not an SQLAlchemy-style URL (amqp://...)
                match = re.search(r"://[^/]*:(\d+)(/|$)", url)
                port = int(match.group(1)) if match else None
            if port:
                ports.append(port)
        return ports

    @property
    def redis_visibility_timeout_s(self) -> int:
        return self.visibility_timeout_s or self.task_time_limit_s + 60

    @property
    def models(self) -> list[str]:
        """Model aliases offered in the UI, the default first."""
        names = [m.strip() for m in self.models_csv.split(",") if m.strip()]
        return [self.default_model, *[m for m in names if m != self.default_model]]

    @property
    def max_request_bytes(self) -> int:
        """The largest request body accepted (413 beyond): a maximal document, JSON-escaped, or a
        maximal upload, with room for the rest of the request."""
        return max(6 * self.max_document_chars, 2 * self.max_upload_bytes) + (1 << 20)

    @property
    def loopback_bind(self) -> bool:
        """True when the web app listens on a loopback address only."""
        return is_loopback(self.bind_host)

    @property
    def allowed_hosts(self) -> list[str]:
        """Host names the app answers to: `KVNOTES_ALLOWED_HOSTS`, else the loopback names and the
        bound address (an unspecified bind such as 0.0.0.0 names no host)."""
        configured = [h.strip().lower() for h in self.allowed_hosts_csv.split(",") if h.strip()]
        if configured:
            return configured
        hosts = ["127.0.0.1", "localhost", "::1"]
        bound = self.bind_host.strip().strip("[]").lower()
        if bound and bound not in hosts and bound not in ("0.0.0.0", "::"):
            hosts.append(bound)
        return hosts

    def ensure_data_dir(self) -> Path:
        """Create the data folder (and nothing else) when it is missing, readable by its owner only
        (0700: it holds the database, the broker's messages and the secret key); a folder of ours
        left open to others is closed."""
        self.data_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        try:
            info = self.data_dir.stat()
            if info.st_uid == os.getuid() and info.st_mode & 0o077:
                self.data_dir.chmod(0o700)
        except OSError:  # not ours to change (a mounted volume): leave it
            pass
        return self.data_dir



def job_deadlines(value: str) -> dict[str, float]:
    """"3600,trajectory=600" -> {"*": 3600.0, "trajectory": 600.0}; ValueError naming a bad part."""
    out: dict[str, float] = {}
    for part in (p.strip() for p in value.split(",") if p.strip()):
        kind, _, seconds = part.rpartition("=")
        if kind.strip() not in ("", "run", "trajectory", "replay"):
            raise ValueError(f"KVNOTES_JOB_DEADLINE_S: {part!r} names no kind (run, trajectory, replay)")
        try:
            number = float(seconds)
        except ValueError:
            number = -1.0
        if not number > 0:
            raise ValueError(f"KVNOTES_JOB_DEADLINE_S: {part!r} is not a number of seconds above 0")
        out[kind.strip() or "*"] = number
    return out


@lru_cache(maxsize=1)
def get_settings() -> Settings:
    """The process's settings, read once. Tests call `get_settings.cache_clear()` after changing
    the environment."""
    settings = Settings()
    settings.ensure_data_dir()
    return settings


def is_loopback(host: str | None) -> bool:
    """127.0.0.0/8, ::1 and `localhost`."""
    if not host:
        return False
    host = host.strip().strip("[]").lower()
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def redact(url: str) -> str:
    """`url` with its password hidden, for logs and error messages."""
    try:
        return make_url(url).render_as_string(hide_password=True)
    except Exception:  # not an SQLAlchemy-style URL (amqp://...): drop anything after a password
        return re.sub(r"://([^:/@]+):[^@]*@", r"://\1:***@", url)
