#!/usr/bin/env bash
# Which Triton kernels compile after a server's warm-up (each one a JIT stall of a live request):
# an empty Triton cache, a colocated server on the tiny model, a snapshot of the cache once
# /health answers, bench_serving's random load, a second snapshot; the kernels new in the second
# are printed with their specialisation (signature and constants from the cache's metadata).
#   scripts/gpu/jit_after_warmup.sh TINY_MODEL_DIR [server args...]   (device; needs the wheels)
set -uo pipefail
MODEL=$1; shift
export TRITON_CACHE_DIR=$(mktemp -d /tmp/tritoncache.XXXX)
PORT=$(python3 -c "import socket;s=socket.socket();s.bind(('127.0.0.1',0));print(s.getsockname()[1])")
python3 -m sglang_pd.launch_server --model-path "$MODEL" --port "$PORT" --device cuda --dtype bfloat16 \
  --attention-backend triton --max-total-tokens 65536 "$@" >/tmp/jit_server.log 2>&1 &
PID=$!
python3 -c "
import time, urllib.request
for _ in range(240):
    try:
        urllib.request.urlopen('http://127.0.0.1:$PORT/health', timeout=2); break
    except Exception: time.sleep(0.5)"
snap() { find "$TRITON_CACHE_DIR" -name '*.json' ! -name '__grp__*' | sort; }
snap >/tmp/jit_before
echo "after warm-up: $(wc -l </tmp/jit_before) kernels in the cache"
python3 -m sglang_pd.bench_serving --backend sglang --base-url "http://127.0.0.1:$PORT" --dataset-name random \
  --num-prompts 64 --random-input-len 128 --random-output-len 32 --random-range-ratio 1 --request-rate 32 \
  --disable-tqdm --tokenizer "$MODEL" 2>&1 | grep -i "ttft\|completed" | head -4
snap >/tmp/jit_after
echo "compiled during the load: $(comm -13 /tmp/jit_before /tmp/jit_after | wc -l)"
for f in $(comm -13 /tmp/jit_before /tmp/jit_after); do
  python3 - "$f" <<'PY'
import json, sys
m = json.load(open(sys.argv[1]))
keep = {k: m[k] for k in ("name", "num_warps", "num_stages", "constants", "signature", "specialization") if k in m}
print(json.dumps(keep)[:700])
PY
done
kill $PID; wait $PID 2>/dev/null
