# Shared by the bench_serving_*.sh wrappers (sourced, not run).
# Sets REPO, PY (the repo's venv python when present) and URL from a PORT or URL argument.
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
export PYTHONPATH="$REPO/python${PYTHONPATH:+:$PYTHONPATH}"
if [[ -n "${PYTHON:-}" ]]; then PY=$PYTHON
elif [[ -x "$REPO/.venv/bin/python" ]]; then PY="$REPO/.venv/bin/python"
else PY=python3; fi
bench_url() {  # bench_url PORT|URL -> URL
  case "$1" in http://*|https://*) echo "$1" ;; *) echo "http://127.0.0.1:$1" ;; esac
}
