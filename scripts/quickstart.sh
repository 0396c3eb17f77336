#!/usr/bin/env bash
# Quickstart: set up, build the tiny model, start a local server, print a completion,
# run a short load test, and shut everything down cleanly.
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck disable=SC1091
source scripts/setup_env.sh test
export UCX_NET_DEVICES="${UCX_NET_DEVICES:-lo}" NIXL_LOG_LEVEL="${NIXL_LOG_LEVEL:-WARN}"

MODEL_DIR="${MODEL_DIR:-models/tiny-llama}"
PORT="${PORT:-30000}"
LOG_DIR="${LOG_DIR:-out/quickstart}"
mkdir -p "$LOG_DIR"

if [ ! -f "$MODEL_DIR/model.safetensors" ]; then
  echo "[quickstart] building the tiny model in $MODEL_DIR"
  python -m sglang_pd.tools.make_tiny_model "$MODEL_DIR" --arch llama
fi

PIDS=()
cleanup() {
  for pid in "${PIDS[@]}"; do kill -TERM "$pid" 2>/dev/null || true; done
  for pid in "${PIDS[@]}"; do wait "$pid" 2>/dev/null || true; done
}
trap cleanup EXIT

wait_healthy() {  # url, pid
  for _ in $(seq 1 300); do
    if curl -sf "$1/health" >/dev/null; then return 0; fi
    if ! kill -0 "$2" 2>/dev/null; then echo "[quickstart] server died; see $LOG_DIR"; exit 1; fi
    sleep 0.5
  done
  echo "[quickstart] server at $1 not healthy after 150 s"; exit 1
}

echo "[quickstart] starting a colocated server on port $PORT (log: $LOG_DIR/server.log)"
python -m sglang_pd.launch_server --model-path "$MODEL_DIR" --mode colocated --port "$PORT" \
  >"$LOG_DIR/server.log" 2>&1 &
PIDS+=($!)
wait_healthy "http://127.0.0.1:$PORT" "${PIDS[-1]}"
URL="http://127.0.0.1:$PORT"

echo "[quickstart] a completion (POST /v1/completions):"
curl -s "$URL/v1/completions" -H 'Content-Type: application/json' \
  -d '{"model": "tiny", "prompt": "The river flows", "max_tokens": 24, "temperature": 0}'
echo
echo "[quickstart] a short load test:"
python -m sglang_pd.bench_serving --backend sglang --base-url "$URL" --dataset-name random \
  --num-prompts 32 --random-input-len 128 --random-output-len 32 --request-rate 8 --seed 1
echo "[quickstart] done; shutting down"
