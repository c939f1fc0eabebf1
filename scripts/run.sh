#!/usr/bin/env bash
# Install if needed, then start kvnotes (web app and worker). Arguments go to `kvnotes serve`.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install.sh
exec .venv/bin/kvnotes serve "$@"
