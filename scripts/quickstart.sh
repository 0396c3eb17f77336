#!/usr/bin/env bash
# Quickstart: our PD stack on one machine, end to end (issue 34's mission in one command).
#   our router (sglang-pd-router, length-aware) in front of
#     a short-role prefill server and a long-role prefill server (dual queues, kairos+),
#     a decode server (slack+: every request kept on its TPOT pace);
#   a completion through it, then a short Poisson long-tail load test (~90% short prompts,
#   ~10% long) whose report shows TTFT and TPOT attainment per class against the SLOs below.
# QUICKSTART_ROUTER=sglang runs the same servers behind SGLang's router (fcfs prefill,
# continuous decode: SGLang PD as people run it) for comparison.
# SGLANG_PD_SKIP_SETUP=1 uses the python already on PATH (no venv setup).
set -euo pipefail
cd "$(dirname "$0")/.."
if [ "${SGLANG_PD_SKIP_SETUP:-0}" != "1" ]; then
  # shellcheck disable=SC1091
  source scripts/setup_env.sh test,bench  # bench: plots of the load test
fi
export UCX_NET_DEVICES="${UCX_NET_DEVICES:-lo}" NIXL_LOG_LEVEL="${NIXL_LOG_LEVEL:-WARN}"
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}"  # three engines share the cores: one thread each

MODEL_DIR="${MODEL_DIR:-models/tiny-llama}"
PORT="${PORT:-30000}"
LOG_DIR="${LOG_DIR:-out/quickstart}"
ROUTER="${QUICKSTART_ROUTER:-ours}"
# the workload and its SLOs (ms): short prompts <= SHORT_THRESHOLD tokens; long ones get a
# looser TTFT SLO (their prefill alone takes longer); one TPOT SLO for both
SHORT_THRESHOLD="${SHORT_THRESHOLD:-256}"
LENGTH_MIX="${LENGTH_MIX:-48:24:0.9,1536:24:0.1}"
NUM_PROMPTS="${NUM_PROMPTS:-80}"
RATE="${RATE:-4}"
SLO_TTFT_SHORT_MS="${SLO_TTFT_SHORT_MS:-300}"
SLO_TTFT_LONG_MS="${SLO_TTFT_LONG_MS:-3000}"
SLO_TPOT_MS="${SLO_TPOT_MS:-100}"
case "$ROUTER" in ours|sglang) ;; *) echo "QUICKSTART_ROUTER must be ours or sglang"; exit 2;; esac
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

wait_healthy() {  # url, pid, what
  for _ in $(seq 1 300); do
    if curl -sf "$1/health" >/dev/null; then return 0; fi
    if ! kill -0 "$2" 2>/dev/null; then echo "[quickstart] $3 died; see $LOG_DIR"; exit 1; fi
    sleep 0.5
  done
  echo "[quickstart] $3 at $1 not healthy after 150 s"; exit 1
}

PS_PORT="${PS_PORT:-30010}"; PL_PORT="${PL_PORT:-30011}"; D_PORT="${D_PORT:-30020}"
PS_BOOT="${PS_BOOT:-8998}"; PL_BOOT="${PL_BOOT:-8999}"
FLAGS=(--model-path "$MODEL_DIR" --page-size 16 --max-total-tokens 65536
       --chunked-prefill-size 512 --slo-ttft-ms "$SLO_TTFT_SHORT_MS" --slo-tpot-ms "$SLO_TPOT_MS")
if [ "$ROUTER" = ours ]; then
  PREFILL=(--prefill-policy kairos+ --prefill-queues dual --short-prefill-threshold "$SHORT_THRESHOLD")
  ROLES=(short long); DECODE=(--decode-policy slack+)
else
  PREFILL=(--prefill-policy fcfs); ROLES=(both both); DECODE=(--decode-policy continuous)
fi

echo "[quickstart] starting prefill :$PS_PORT (${ROLES[0]}) and :$PL_PORT (${ROLES[1]})," \
     "decode :$D_PORT (logs: $LOG_DIR)"
python -m sglang_pd.launch_server "${FLAGS[@]}" "${PREFILL[@]}" --prefill-role "${ROLES[0]}" \
  --mode prefill --port "$PS_PORT" --disaggregation-bootstrap-port "$PS_BOOT" \
  >"$LOG_DIR/prefill_short.log" 2>&1 &
PIDS+=($!); PS_PID=$!
python -m sglang_pd.launch_server "${FLAGS[@]}" "${PREFILL[@]}" --prefill-role "${ROLES[1]}" \
  --mode prefill --port "$PL_PORT" --disaggregation-bootstrap-port "$PL_BOOT" \
  >"$LOG_DIR/prefill_long.log" 2>&1 &
PIDS+=($!); PL_PID=$!
python -m sglang_pd.launch_server "${FLAGS[@]}" "${DECODE[@]}" --mode decode --port "$D_PORT" \
  >"$LOG_DIR/decode.log" 2>&1 &
PIDS+=($!); D_PID=$!
wait_healthy "http://127.0.0.1:$PS_PORT" "$PS_PID" "short prefill"
wait_healthy "http://127.0.0.1:$PL_PORT" "$PL_PID" "long prefill"
wait_healthy "http://127.0.0.1:$D_PORT" "$D_PID" "decode"

WORKERS=(--prefill "http://127.0.0.1:$PS_PORT" "$PS_BOOT" --prefill "http://127.0.0.1:$PL_PORT" "$PL_BOOT"
         --decode "http://127.0.0.1:$D_PORT" --host 127.0.0.1 --port "$PORT")
if [ "$ROUTER" = ours ]; then
  # prompts counted exactly (the tokenizer), short ones to the short pool; the pool
  # controller stays off: with two instances it would empty one pool (docs/router.md)
  echo "[quickstart] starting our router (sglang-pd-router, length_aware) on :$PORT"
  python -m sglang_pd_router --pd-disaggregation "${WORKERS[@]}" --tokenizer-path "$MODEL_DIR" \
    --short-prefill-threshold "$SHORT_THRESHOLD" --pool-controller off \
    --slo-ttft-ms "$SLO_TTFT_SHORT_MS" "$SLO_TTFT_LONG_MS" --slo-tpot-ms "$SLO_TPOT_MS" \
    --log-level warning >"$LOG_DIR/router.log" 2>&1 &
else
  echo "[quickstart] starting SGLang's router (sglang_router) on :$PORT"
  python -m sglang_router.launch_router --pd-disaggregation "${WORKERS[@]}" \
    >"$LOG_DIR/router.log" 2>&1 &
fi
PIDS+=($!); R_PID=$!
URL="http://127.0.0.1:$PORT"
wait_healthy "$URL" "$R_PID" "router"

echo "[quickstart] a completion through the PD cluster (POST /v1/completions):"
curl -sf "$URL/v1/completions" -H 'Content-Type: application/json' \
  -d '{"model": "tiny", "prompt": "The river flows", "max_tokens": 24, "temperature": 0}'
echo
echo "[quickstart] a long-tail load test through the router: $NUM_PROMPTS requests at $RATE req/s," \
     "mix $LENGTH_MIX (IN:OUT:WEIGHT); SLOs: TTFT short $SLO_TTFT_SHORT_MS ms," \
     "long $SLO_TTFT_LONG_MS ms, TPOT $SLO_TPOT_MS ms"
python -m sglang_pd.bench_serving --backend sglang --base-url "$URL" --tokenizer "$MODEL_DIR" \
  --dataset-name mix --length-mix "$LENGTH_MIX" --num-prompts "$NUM_PROMPTS" \
  --request-rate "$RATE" --seed 1 --disable-tqdm \
  --long-threshold "$((SHORT_THRESHOLD + 1))" --slo-ttft-ms "$SLO_TTFT_SHORT_MS" \
  --slo-ttft-ms-long "$SLO_TTFT_LONG_MS" --slo-tpot-ms "$SLO_TPOT_MS"
echo "[quickstart] done ($ROUTER router); shutting down"
