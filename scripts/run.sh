#!/usr/bin/env bash
# Install if needed, then start kvnotes (web app and worker). Arguments go to `kvnotes serve`:
#   scripts/run.sh --port 8001        another port (default 8000); --host H another address
# The command line lives in .venv: `source .venv/bin/activate` puts `kvnotes` on PATH (README,
# "Command line"); it shares this data folder (`var/` in the checkout unless KVNOTES_DATA is set).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install.sh
echo "kvnotes: for the command line in another shell: source $PWD/.venv/bin/activate (then: kvnotes --help)" >&2
exec .venv/bin/kvnotes serve "$@"
