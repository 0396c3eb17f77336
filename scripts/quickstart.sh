#!/usr/bin/env bash
# Quickstart: set up, build the tiny model, start a local server, print a completion,
# run a short load test, and shut everything down cleanly.
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck disable=SC1091
source scripts/setup_env.sh test,bench  # bench: plots of the load test
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

P_PORT="${P_PORT:-30010}"; D_PORT="${D_PORT:-30020}"; BOOT_PORT="${BOOT_PORT:-8998}"
FLAGS=(--model-path "$MODEL_DIR" --page-size 16 --max-total-tokens 65536)

echo "[quickstart] starting a PD cluster: prefill :$P_PORT (bootstrap :$BOOT_PORT), decode :$D_PORT (logs: $LOG_DIR)"
python -m sglang_pd.launch_server "${FLAGS[@]}" --mode prefill --port "$P_PORT" \
  --disaggregation-bootstrap-port "$BOOT_PORT" >"$LOG_DIR/prefill.log" 2>&1 &
PIDS+=($!); P_PID=$!
python -m sglang_pd.launch_server "${FLAGS[@]}" --mode decode --port "$D_PORT" >"$LOG_DIR/decode.log" 2>&1 &
PIDS+=($!); D_PID=$!
wait_healthy "http://127.0.0.1:$P_PORT" "$P_PID"
wait_healthy "http://127.0.0.1:$D_PORT" "$D_PID"

# SGLang's own PD router (a light Rust wheel) drives our servers through SGLang's PD protocol.
echo "[quickstart] starting SGLang's router on :$PORT in front of them"
python -m sglang_router.launch_router --pd-disaggregation \
  --prefill "http://127.0.0.1:$P_PORT" "$BOOT_PORT" --decode "http://127.0.0.1:$D_PORT" \
  --host 127.0.0.1 --port "$PORT" >"$LOG_DIR/router.log" 2>&1 &
PIDS+=($!); R_PID=$!
URL="http://127.0.0.1:$PORT"
for _ in $(seq 1 120); do
  if curl -sf "$URL/health" >/dev/null; then break; fi
  kill -0 "$R_PID" 2>/dev/null || { echo "[quickstart] router died; see $LOG_DIR/router.log"; exit 1; }
  sleep 0.5
done

echo "[quickstart] a completion through the PD cluster (POST /v1/completions):"
curl -sf "$URL/v1/completions" -H 'Content-Type: application/json' \
  -d '{"model": "tiny", "prompt": "The river flows", "max_tokens": 24, "temperature": 0}'
echo
echo "[quickstart] a short load test through the router:"
python -m sglang_pd.bench_serving --backend sglang --base-url "$URL" --tokenizer "$MODEL_DIR" \
  --dataset-name random --num-prompts 32 --random-input-len 128 --random-output-len 32 \
  --request-rate 8 --seed 1
echo "[quickstart] done; shutting down"
