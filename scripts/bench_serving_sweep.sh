#!/usr/bin/env bash
# Rate sweep with ShareGPT lengths (Poisson arrivals): throughput, SLO attainment and goodput
# per rate, one JSONL line each, plots under out/bench/sweep/.
#   scripts/bench_serving_sweep.sh [PORT|URL] [more flags...]
# Environment: RATES (default 1,2,4,8), N (requests per rate, default 100), BACKEND,
# SLO_TTFT_MS (default 2000), SLO_TPOT_MS (default 200).
set -euo pipefail
source "$(dirname "$0")/bench_env.sh"
URL=$(bench_url "${1:-30000}"); shift || true
OUT="$REPO/out/bench"
mkdir -p "$OUT"
exec "$PY" -m sglang_pd.bench_serving --backend "${BACKEND:-sglang}" --base-url "$URL" \
  --dataset-name sharegpt-lengths --num-prompts "${N:-100}" --sweep-rates "${RATES:-1,2,4,8}" \
  --max-input-len 2048 --max-output-len 256 --long-threshold 1024 \
  --slo-ttft-ms "${SLO_TTFT_MS:-2000}" --slo-tpot-ms "${SLO_TPOT_MS:-200}" \
  --output-file "$OUT/sweep.jsonl" --plot "$OUT/sweep" "$@"
