#!/usr/bin/env bash
# The suite under load (issue 32): a fresh clone of HEAD, one core kept busy by a spinning
# process the whole time, then `bash .ci/run` (setup + scripts/test.sh, as CI) followed by
# `scripts/test.sh` again until RUNS runs passed in a row; stops at the first failure.
# Each run's tail and wall time go to LOG; the busy loop is killed on every exit path.
#   scripts/test_under_load.sh [RUNS=3] [LOG=/tmp/test_under_load.log]
set -uo pipefail
RUNS=${1:-3}
LOG=${2:-/tmp/test_under_load.log}
SRC=$(cd "$(dirname "$0")/.." && pwd)
DIR=$(mktemp -d /tmp/test_under_load.XXXXXX)
git clone -q "$SRC" "$DIR" && cd "$DIR" || exit 1
python3 -c "while True: pass" &
BUSY=$!
trap 'kill $BUSY 2>/dev/null' EXIT
echo "clone $(git rev-parse --short HEAD) in $DIR at $(date -u +%T); busy loop pid $BUSY" | tee -a "$LOG"
for i in $(seq "$RUNS"); do
  t0=$(date +%s)
  echo "run $i start $(date -u +%T) load $(cut -d' ' -f1-3 /proc/loadavg)" | tee -a "$LOG"
  if [[ $i == 1 ]]; then bash .ci/run >"$DIR/run$i.out" 2>&1; else bash scripts/test.sh >"$DIR/run$i.out" 2>&1; fi
  rc=$?
  echo "run $i rc $rc wall $(( $(date +%s) - t0 )) s load $(cut -d' ' -f1-3 /proc/loadavg): $(tail -1 "$DIR/run$i.out")" | tee -a "$LOG"
  [[ $rc == 0 ]] || exit "$rc"
done
