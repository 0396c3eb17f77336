#!/usr/bin/env bash
# Replay a shipped trace with its own arrival times, clamped to fit a small model's context,
# with SLOs, JSONL and plots under out/bench/.
#   scripts/bench_serving_trace.sh [PORT|URL] [more flags...]
# Environment: TRACE (azure-conv | azure-code | mooncake | FILE), N (requests, default 200),
# SCALE (time scale, default 1), BACKEND (default sglang), SLO_TTFT_MS, SLO_TPOT_MS.
set -euo pipefail
source "$(dirname "$0")/bench_env.sh"
URL=$(bench_url "${1:-30000}"); shift || true
TRACE=${TRACE:-azure-conv}
NAME=$(basename "$TRACE" | sed 's/\.[a-z]*$//')
OUT="$REPO/out/bench"
mkdir -p "$OUT"
exec "$PY" -m sglang_pd.bench_serving --backend "${BACKEND:-sglang}" --base-url "$URL" \
  --trace "$TRACE" --num-prompts "${N:-200}" --time-scale "${SCALE:-1}" \
  --max-input-len 2048 --max-output-len 256 --long-threshold 1024 \
  --slo-ttft-ms "${SLO_TTFT_MS:-2000}" --slo-tpot-ms "${SLO_TPOT_MS:-200}" \
  --output-file "$OUT/trace_$NAME.jsonl" --plot "$OUT/trace_$NAME" "$@"
