#!/usr/bin/env bash
# Download the cp312 manylinux wheels the device image lacks into .whl/ (ignored; carried with
# `carry: [".whl"]`). Pins are the shared venv's versions; every Requires-Dist the image lacks
# is listed (fastapi needs opentelemetry-api; pydantic needs typing-extensions>=4.16) (checked with `unzip -p WHEEL '*/METADATA' | grep ^Requires-Dist`).
#   scripts/gpu/wheels.sh            # the server's wheels, ~4 MB
#   scripts/gpu/wheels.sh --nixl     # also nixl-cu13 into .whl-nixl/ (59 MB: does not fit in the
#                                    # same call as the tree; carry it alone, see docs/gpu.md)
#   scripts/gpu/wheels.sh --list     # print the pinned list and exit
set -euo pipefail
cd "$(dirname "$0")/../.."
PY=${PYTHON:-python3}
WHEELS=(
  msgspec==0.22.0 pyzmq==27.3.0 orjson==3.13.0
  fastapi==0.165.0 starlette==1.10.0 uvicorn==0.54.0
  pydantic==2.14.4 pydantic-core==2.50.5 annotated-types==0.8.0 typing-inspection==0.4.5
  typing-extensions==4.16.0 opentelemetry-api==1.45.2
)
NIXL=(nixl==1.5.1 nixl-cu13==1.5.1)
if [[ "${1:-}" == "--list" ]]; then printf '%s\n' "${WHEELS[@]}"; exit 0; fi
fetch() {  # DEST NAME==VER...
  local dest=$1; shift
  "$PY" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 \
    --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 --platform manylinux1_x86_64 \
    -d "$dest" "$@"
}
fetch .whl "${WHEELS[@]}"
[[ "${1:-}" == "--nixl" ]] && fetch .whl-nixl "${NIXL[@]}"
ls -l .whl/*.whl
du -sh .whl ${1:+.whl-nixl} 2>/dev/null || true
