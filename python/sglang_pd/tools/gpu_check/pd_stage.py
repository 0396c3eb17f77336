"""Stage pd: prefill/decode disaggregation over NIXL (VRAM to VRAM) against colocated serving.
nixl-cu13 is 59 MB: it does not travel with the tree in one call (64 MiB), so this stage runs
only where a ``.whl-nixl`` folder was carried (docs/gpu.md section 3.5) and nixl imports."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

from sglang_pd.tools.gpu_check.common import Ctx, Skip


def run(ctx: Ctx, rec: Any) -> str:
    carried = Path(".whl-nixl").is_dir()
    importable = importlib.util.find_spec("nixl") is not None
    rec.data.update(whl_nixl_carried=carried, nixl_importable=importable)
    if not carried or not importable:
        raise Skip("skipped: NIXL not present (nixl-cu13 is 59 MB, over what one call carries "
                   "with the tree; carry .whl-nixl in an earlier call to run it)")
    raise Skip("skipped: NIXL present, but the PD measurement is not written yet")
