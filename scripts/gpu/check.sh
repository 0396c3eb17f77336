#!/usr/bin/env bash
# The prepared device run (docs/gpu.md section 3): on a bare GPU machine, in one call, install
# the carried wheels, build the tiny model, run every stage in its own process under its own
# time limit (a failed or killed stage is recorded and the next one runs), then write
# gpu_report.json + gpu_report.md into --out (default $OUT, else ./gpu_out) and print a table.
#   scripts/gpu/check.sh [--dry-run] [--out DIR] [--stages env,kernels,...] [--budget S]
# --dry-run: CPU, float32, tiny sizes, every stage's CPU-capable part (what CI runs).
# PYTHON picks the interpreter (default python3, the one with torch on the device image).
set -uo pipefail
cd "$(dirname "$0")/../.."
ROOT=$PWD
PY=${PYTHON:-python3}
DRY=0; OUT_DIR=${OUT:-}; ONLY=""; BUDGET=300  # seconds for the whole run: a stage gets what is left
while [[ $# -gt 0 ]]; do
  case $1 in
    --dry-run) DRY=1 ;;
    --out) OUT_DIR=$2; shift ;;
    --stages) ONLY=$2; shift ;;
    --budget) BUDGET=$2; shift ;;
    *) echo "unknown argument $1" >&2; exit 2 ;;
  esac
  shift
done
OUT_DIR=${OUT_DIR:-$ROOT/gpu_out}
WORK=$(mktemp -d /tmp/gpucheck.XXXXXX)
mkdir -p "$WORK/logs" "$OUT_DIR"
export PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
T0=$SECONDS
say() { printf '[check %3ds] %s\n' $((SECONDS - T0)) "$*"; }

# ---- wheels: the device image lacks the server's packages (scripts/gpu/wheels.sh fetched them)
SITE=""
if [[ $DRY == 0 ]]; then
  SITE=/tmp/site
  for d in .whl .whl-nixl; do
    if compgen -G "$d/*.whl" >/dev/null; then
      # only what the image lacks or has older (a carried wheel never shadows a newer one)
      mapfile -t NEED < <("$PY" python/sglang_pd/tools/gpu_check/wheels.py $d/*.whl 2>>"$WORK/logs/install.log")
      say "installing ${#NEED[@]} of $(ls $d/*.whl | wc -l) wheels from $d into $SITE"
      [[ ${#NEED[@]} -gt 0 ]] && { timeout 90 "$PY" -m pip install -q --no-index --no-deps --no-compile \
        --no-cache-dir --upgrade --target "$SITE" "${NEED[@]}" >>"$WORK/logs/install.log" 2>&1 \
        || say "pip install from $d FAILED: $(tail -3 "$WORK/logs/install.log")"; }
    fi
  done
  [[ -d .whl ]] || say "no .whl folder: run scripts/gpu/wheels.sh here and carry .whl"
fi
export PYTHONPATH=${SITE:+$SITE:}$ROOT/python:$ROOT/router:$ROOT/sgl-kernel${PYTHONPATH:+:$PYTHONPATH}
if [[ $DRY == 1 ]]; then export TRITON_INTERPRET=1; fi  # Triton kernels on CPU: the interpreter

# ---- the plan
mapfile -t PLAN < <("$PY" -c "from sglang_pd.tools.gpu_check import STAGES
for n, (_, s) in STAGES.items(): print(n, s)")
say "plan ($([[ $DRY == 1 ]] && echo 'dry run: CPU, float32, tiny sizes' || echo device)), work $WORK, out $OUT_DIR"
for line in "${PLAN[@]}"; do echo "    stage ${line% *}: limit ${line#* } s"; done
echo "    wheels: $(bash scripts/gpu/wheels.sh --list | tr '\n' ' ')"

# ---- the tiny model (byte-identical everywhere; parity, serving and short-prefill use it)
say "building the tiny model"
timeout 45 "$PY" -m sglang_pd.tools.make_tiny_model "$WORK/tiny" >"$WORK/logs/tiny_model.log" 2>&1 \
  || say "tiny model FAILED: $(tail -3 "$WORK/logs/tiny_model.log")"

report() {  # after every stage too: a run killed from outside still leaves the report so far
  for f in "$WORK"/logs/*.log; do echo "===== $(basename "$f")"; tail -400 "$f"; done >"$OUT_DIR/gpu_check_logs.txt"
  "$PY" -m sglang_pd.tools.gpu_check.report --work "$WORK" --out "$OUT_DIR" \
    $([[ $DRY == 1 ]] && echo --dry-run) "$@"
}

# ---- the stages
for line in "${PLAN[@]}"; do
  name=${line% *}; limit=${line#* }
  if [[ -n $ONLY && ",$ONLY," != *",$name,"* ]]; then continue; fi
  if [[ $DRY == 1 ]]; then
    limit=120  # a shared CPU: generous, the dry run is small anyway
  else
    left=$((BUDGET - (SECONDS - T0) - 15))  # 15 s kept for the report
    if [[ $left -lt 10 ]]; then
      say "stage $name: SKIPPED, the run's ${BUDGET}s budget is spent"
      printf '{"stage": "%s", "status": "skip", "summary": "skipped: the run budget (%ss) was spent", "data": {}}' \
        "$name" "$BUDGET" >"$WORK/stage_$name.json"
      continue
    fi
    [[ $left -lt $limit ]] && limit=$left
  fi
  say "stage $name (limit ${limit}s)"
  timeout -k 5 "$limit" "$PY" -m sglang_pd.tools.gpu_check.run_stage "$name" --work "$WORK" \
    --tiny-model "$WORK/tiny" $([[ $DRY == 1 ]] && echo --dry-run) >"$WORK/logs/$name.log" 2>&1
  echo $? >"$WORK/rc_$name"
  say "  -> exit $(cat "$WORK/rc_$name"): $(tail -1 "$WORK/logs/$name.log" | cut -c1-200)"
  report --quiet >/dev/null 2>&1
done

# ---- the report (3 files under OUT: the device tool brings back at most 8)
report
rc=$?
say "done in $((SECONDS - T0)) s"
exit $rc
