#!/usr/bin/env bash
# Install if needed, make sure the browser (and under CI the database and broker) are there, lint
# with ruff (lines within 110 characters included), run every test. Arguments go to pytest, e.g.
# `scripts/test.sh -m "not slow"` or `-k models`.
set -euo pipefail
cd "$(dirname "$0")/.."
# The install converts the bundled models where the tests read them (tests/conftest.py data_dir),
# so a fresh clone converts each model once, not once for the app and again for the tests. The
# converted copies live in a per-machine cache (like vLLM's environment below), keyed by the
# converter's code and the project's dependencies, so a second clone on this machine reuses them.
MODELS_KEY="$({ cat worker/engine/models.py; sed -n '/^dependencies/,/^]/p' pyproject.toml; } | sha256sum)"
MODELS_CACHE="$HOME/.cache/kvnotes/models-${MODELS_KEY:0:12}"
if [[ ! -e var/test-data/models ]]; then
    mkdir -p "$MODELS_CACHE" var/test-data
    ln -s "$MODELS_CACHE" var/test-data/models
fi
KVNOTES_DATA="$PWD/var/test-data" scripts/install.sh

if [[ ! -x /usr/bin/chromium ]]; then
    if [[ "$(id -u)" == 0 ]] && command -v apt-get >/dev/null; then
        echo "test: installing chromium for the browser tests" >&2
        apt-get install -y -qq chromium >/dev/null \
            || { apt-get update -qq && apt-get install -y -qq chromium >/dev/null; }
    else
        echo "test: /usr/bin/chromium missing and not root; browser tests will skip" >&2
    fi
fi

port_open() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

if [[ "${CI:-}" == true ]]; then
    if ! port_open 5432; then
        echo "test: starting PostgreSQL" >&2
        pg_ctlcluster --skip-systemctl-redirect "$(ls /etc/postgresql)" main start
    fi
    if ! port_open 6379; then
        echo "test: starting Redis" >&2
        mkdir -p /var/lib/redis /var/log/redis
        redis-server --daemonize yes --bind 127.0.0.1 -::1 --port 6379 --save "" --appendonly no \
            --dir /var/lib/redis --logfile /var/log/redis/ci.log
    fi
    for _ in $(seq 30); do port_open 5432 && port_open 6379 && break; sleep 1; done
    port_open 5432 || { echo "test: PostgreSQL is not reachable on 5432" >&2; exit 1; }
    port_open 6379 || { echo "test: Redis is not reachable on 6379" >&2; exit 1; }
    # The serving tests start a vLLM server (tests/serving): its 3.5 GB environment is installed
    # once per machine and reused by later runs.
    export KVNOTES_VLLM_VENV="${KVNOTES_VLLM_VENV:-$HOME/.cache/kvnotes/venv-vllm}"
    scripts/vllm.sh --install
fi

echo "test: ruff (lint and lines within 110 characters)" >&2
.venv/bin/ruff check .

# Two xdist workers by default, each test file on one worker and the tests that need vLLM or
# Chromium together (tests/conftest.py's pytest_collection_modifyitems), so each server starts once
# per run, and torch in each worker with as many threads as the machine has cores, idle threads
# asleep (OMP_WAIT_POLICY=PASSIVE): while one worker waits (a server, a sleep, a subprocess) the
# other has every core. Measured on a fresh clone (2026-12-02, quiet 2-core machine, models and
# vLLM's environment already cached): pytest 19.5 min, against 35.0 min for one process and 36.1 min
# for two workers of one thread each. KVNOTES_TEST_WORKERS=0 runs one process, in pytest's order.
# The 15 slowest tests at the end.
WORKERS="${KVNOTES_TEST_WORKERS:-2}"
PARALLEL=()
if [[ "$WORKERS" != 0 ]]; then
    export OMP_NUM_THREADS="${OMP_NUM_THREADS:-$(nproc)}" OMP_WAIT_POLICY="${OMP_WAIT_POLICY:-PASSIVE}"
    PARALLEL=(-n "$WORKERS" --dist loadgroup --no-loadscope-reorder)
fi
exec .venv/bin/python -m pytest tests -v --timeout 1800 --durations=15 "${PARALLEL[@]}" "$@"
