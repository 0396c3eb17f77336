#!/usr/bin/env bash
# Create or reuse .venv and install sglang-pd with what the given extras need.
# Usage: source scripts/setup_env.sh [extras]   (extras default: test)
# CPU installs pin torch==2.13.0 (a CPU wheel; any other request pulls a multi-GB CUDA build).
# On a GPU host set SGLANG_PD_KEEP_TORCH=1 to keep the CUDA torch already installed.
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
_hash="$(cat "$_root/pyproject.toml" "$_root/scripts/setup_env.sh" | sha256sum | cut -c1-16)"
if [ ! -f "$_stamp" ] || [ "$(cat "$_stamp")" != "$_hash" ]; then
  echo "[setup] installing sglang-pd[$_extras] into $_venv (first run takes a few minutes)"
  python -m pip install -q --upgrade pip >/dev/null 2>&1 || true
  if [ "${SGLANG_PD_KEEP_TORCH:-0}" != "1" ]; then
    python -m pip install -q "torch==2.13.0"
  fi
  python -m pip install -q -e "$_root[$_extras]"
  # NIXL for KV transfer (UCX over shared memory / loopback on CPU hosts). Optional: without it
  # PD tests skip with the reason. --no-deps avoids pulling both CUDA 12 and 13 builds.
  python -m pip install -q --no-deps nixl nixl-cu13 || echo "[setup] WARNING: nixl not installed; PD transfer tests will skip"
  echo "$_hash" > "$_stamp"
fi
