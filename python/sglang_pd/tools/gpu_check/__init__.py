"""The prepared device run (``scripts/gpu/check.sh``): one stage per module, each run in its own
process under its own time limit by ``run_stage``, the pieces joined by ``report``.

Every stage has a GPU part and a ``--dry-run`` part (CPU, float32, tiny sizes) so that CI runs
the same code paths the device run takes. See docs/gpu.md section 3.
"""

# name -> (module, time limit in seconds on the device). check.sh's --budget (300 s) caps the run:
# with the wheel install and the tiny model, one call stays under 5 minutes. pd runs only where
# NIXL was carried, which takes a call of its own (docs/gpu.md section 3.5).
STAGES: dict[str, tuple[str, int]] = {
    "env": ("env_stage", 25),
    "kernels": ("kernels_stage", 40),
    "parity": ("parity_stage", 80),
    "decode": ("decode_stage", 50),
    "prefill": ("prefill_stage", 30),
    "short_prefill": ("short_prefill_stage", 35),  # an engine start and 9 bucket captures
    "serving": ("serving_stage", 70),  # the server compiles its kernels into an empty cache
    "pd": ("pd_stage", 60),
}
