#!/usr/bin/env bash
# Set up (or reuse) .venv and run the whole test suite on the CPU.
# Extra arguments go to pytest, e.g. scripts/test.sh test/unit -k sampler
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck disable=SC1091
source scripts/setup_env.sh test
export UCX_NET_DEVICES="${UCX_NET_DEVICES:-lo}" NIXL_LOG_LEVEL="${NIXL_LOG_LEVEL:-WARN}"
exec python -m pytest -q -p no:cacheprovider "${@:-test}"
