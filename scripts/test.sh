#!/usr/bin/env bash
# Set up (or reuse) .venv, check lint (ruff) and types (mypy), then run the test suite on the CPU,
# as CI does. Both checks come first and stop the run (their rules: pyproject.toml).
# Extra arguments go to pytest, e.g. scripts/test.sh test/unit -k sampler
# Tests marked `slow` (timing bars, long soaks) are left out; run them with `-m slow`.
# Every skip is listed with its reason (-rs); a skip for want of NIXL, triton, sglang-router or
# the Helm tools is a failure unless SGLANG_PD_ALLOW_MISSING names it (scripts/setup_env.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck disable=SC1091
source scripts/setup_env.sh test
echo "[test] ruff check"
python -m ruff check python router scripts test sgl-kernel || {
  echo "[test] FAILED: ruff check (above). 'ruff check --fix' applies the safe fixes;" \
       "rules and their reasons: [tool.ruff.lint] in pyproject.toml" >&2
  exit 1
}
echo "[test] mypy"
python -m mypy || {
  echo "[test] FAILED: mypy (above); scope and strictness: [tool.mypy] in pyproject.toml" >&2
  exit 1
}
export UCX_NET_DEVICES="${UCX_NET_DEVICES:-lo}" NIXL_LOG_LEVEL="${NIXL_LOG_LEVEL:-WARN}"
exec python -m pytest -q -p no:cacheprovider -rs -m "not slow" "${@:-test}"
