#!/usr/bin/env bash
# Short load test against a running server: 16 prompts of 64 tokens, 16 output tokens, 8 req/s.
#   scripts/bench_serving_quick.sh [PORT|URL] [more bench_serving flags...]
#   BACKEND=sglang-oai scripts/bench_serving_quick.sh 30000 --slo-ttft-ms 500
set -euo pipefail
source "$(dirname "$0")/bench_env.sh"
URL=$(bench_url "${1:-30000}"); shift || true
exec "$PY" -m sglang_pd.bench_serving --backend "${BACKEND:-sglang}" --base-url "$URL" \
  --dataset-name random --num-prompts 16 --random-input-len 64 --random-output-len 16 \
  --random-range-ratio 1 --request-rate 8 "$@"
