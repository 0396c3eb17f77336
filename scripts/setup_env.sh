#!/usr/bin/env bash
# Create or reuse .venv and install sglang-pd with what the given extras need.
# Usage: source scripts/setup_env.sh [extras]   (extras default: test)
# CPU installs pin torch==2.13.0 (a CPU wheel; any other request pulls a multi-GB CUDA build).
# On a GPU host set SGLANG_PD_KEEP_TORCH=1 to keep the CUDA torch already installed.
# The test extra needs NIXL, triton, sglang-router and the Helm tools (scripts/check_components.py):
# if one fails to install, setup fails and writes no stamp (the next run retries). Where they have
# no wheels (anything but Linux x86_64 with CPython 3.11/3.12) opt out explicitly, e.g.
# SGLANG_PD_ALLOW_MISSING=nixl,triton (or =all); their tests then skip, and -rs lists why.
set -euo pipefail
_extras="${1:-test}"
_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
_venv="${SGLANG_PD_VENV:-$_root/.venv}"
if [ ! -x "$_venv/bin/python" ]; then
  echo "[setup] creating $_venv"
  "${PYTHON:-python3}" -m venv "$_venv"
fi
# shellcheck disable=SC1091
. "$_venv/bin/activate"
_stamp="$_venv/.sglang_pd_installed_${_extras//,/_}"
_required="$(python "$_root/scripts/check_components.py" --all-but "${SGLANG_PD_ALLOW_MISSING:-}")"
# the required set is part of the stamp: a run that needs what an opted-out run lacked retries
_hash="$( (cat "$_root/pyproject.toml" "$_root/scripts/setup_env.sh"; echo "$_required") | sha256sum | cut -c1-16)"
if [ ! -f "$_stamp" ] || [ "$(cat "$_stamp")" != "$_hash" ]; then
  echo "[setup] installing sglang-pd[$_extras] into $_venv (first run takes a few minutes)"
  python -m pip install -q --upgrade pip >/dev/null 2>&1 || true
  if [ "${SGLANG_PD_KEEP_TORCH:-0}" != "1" ]; then
    python -m pip install -q "torch==2.13.0"
  fi
  python -m pip install -q -e "$_root[$_extras]"
  # NIXL for KV transfer (UCX over shared memory / loopback on CPU hosts); every PD and router
  # end-to-end test needs it. --no-deps avoids pulling both CUDA 12 and 13 builds.
  python -m pip install -q --no-deps "nixl==1.5.1" "nixl-cu13==1.5.1" \
    || echo "[setup] nixl did not install (checked below)"
  if [[ ",$_extras," == *",test,"* ]]; then
    if [ -n "$_required" ] && ! python "$_root/scripts/check_components.py" "$_required"; then
      echo "[setup] ERROR: the tests need the components above; no install stamp written (the next" \
           "run retries). Where they have no wheels (Linux x86_64 CPython 3.11/3.12 only), opt out:" \
           "SGLANG_PD_ALLOW_MISSING=<names>." >&2
      return 1 2>/dev/null || exit 1
    fi
  fi
  echo "$_hash" > "$_stamp"
fi
# the components the tests must find (test/conftest.py fails their skips): all but the opt-outs
if [[ ",$_extras," == *",test,"* ]]; then
  export SGLANG_PD_REQUIRED="$_required"
fi
