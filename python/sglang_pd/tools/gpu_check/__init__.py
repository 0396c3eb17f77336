"""The prepared device run (``scripts/gpu/check.sh``): one stage per module, each run in its own
process under its own time limit by ``run_stage``, the pieces joined by ``report``.

Every stage has a GPU part and a ``--dry-run`` part (CPU, float32, tiny sizes) so that CI runs
the same code paths the device run takes. See docs/gpu.md section 3.
"""

# name -> (module, time limit in seconds on the device). The limits sum to 290 s: with the
# wheel install and the tiny model, one call stays under 5 minutes.
STAGES: dict[str, tuple[str, int]] = {
    "env": ("env_stage", 25),
    "kernels": ("kernels_stage", 40),
    "parity": ("parity_stage", 60),
    "decode": ("decode_stage", 50),
    "prefill": ("prefill_stage", 30),
    "short_prefill": ("short_prefill_stage", 35),  # an engine start and 9 bucket captures
    "serving": ("serving_stage", 45),
    "pd": ("pd_stage", 5),
}
