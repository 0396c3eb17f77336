"""DESIGN.md section 1 import rules, checked with ast."""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PKG = ROOT / "python" / "sglang_pd"


def _imports(path: Path) -> set[str]:
    """Every module a file imports, at any depth (functions included). ``from a import b``
    yields both ``a`` and ``a.b``, so ``from sglang_pd import engine`` counts as the engine."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
            names.update(f"{node.module}.{a.name}" for a in node.names)
    return names


def _violations(where: Path, forbidden: tuple[str, ...]) -> list[str]:
    bad = []
    for path in ([where] if where.is_file() else where.rglob("*.py")):
        for name in _imports(path):
            if any(name == f or name.startswith(f + ".") for f in forbidden):
                bad.append(f"{path.relative_to(ROOT)} imports {name}")
    return bad


def test_scheduling_is_pure() -> None:
    forbidden = ("torch", "zmq", "sglang_pd.engine", "sglang_pd.models", "sglang_pd.disaggregation",
                 "sglang_pd.entrypoints", "socket", "aiohttp")
    assert _violations(PKG / "scheduling", forbidden) == []


def test_core_is_torch_free_and_does_no_io() -> None:
    """core/ is the mechanism the engine, the simulator and the scheduler benchmarks share: no
    torch, nothing of the runtime, no I/O (time is passed in)."""
    forbidden = ("torch", "zmq", "socket", "aiohttp", "asyncio", "threading", "subprocess", "time",
                 "os", "sglang_pd.engine", "sglang_pd.models", "sglang_pd.disaggregation",
                 "sglang_pd.entrypoints", "sglang_pd.frontend", "sglang_pd.sim")
    assert sorted((PKG / "core").glob("*.py")), "core/ is missing"
    assert _violations(PKG / "core", forbidden) == []


def test_frontend_never_imports_engine_or_models() -> None:
    forbidden = ("sglang_pd.engine", "sglang_pd.models", "torch")
    assert _violations(PKG / "frontend", forbidden) == []
    assert _violations(PKG / "entrypoints", forbidden) == []


def test_router_has_no_torch_or_server_internals() -> None:
    forbidden = ("torch", "sglang_pd.engine", "sglang_pd.models")
    assert _violations(ROOT / "router", forbidden) == []


def test_router_is_its_own_distribution_and_its_policies_are_pure() -> None:
    # `pip install ./router` carries no sglang_pd; the policies and the pool controller are
    # shared with the simulator, so they do no I/O (the caller passes time and signals)
    assert _violations(ROOT / "router", ("sglang_pd",)) == []
    io = ("aiohttp", "asyncio", "socket", "prometheus_client", "orjson", "tokenizers", "time")
    router_pkg = ROOT / "router" / "sglang_pd_router"
    assert _violations(router_pkg / "policies", io) == []
    assert _violations(router_pkg / "controller.py", io) == []


def test_protocol_is_plain_data() -> None:
    # plus the one dependency-free SLO unit conversion it shares with the router
    names = {n if n.startswith("sglang_pd_router.") else n.split(".")[0]
             for n in _imports(PKG / "protocol.py")}
    assert names <= {"__future__", "typing", "math", "msgspec", "sglang_pd_router.slo_units",
                     "sglang_pd_router.slo_units.slo_ms_to_s"}


TORCH_FREE_MECHANISM = ("torch", "zmq", "sglang_pd.engine", "sglang_pd.models",
                        "sglang_pd.disaggregation", "sglang_pd.entrypoints", "sglang_pd.frontend")
# scheduler benchmarks drive core/ directly (bench_offline and the serving benches go through a
# server or the offline engine, never engine/ modules themselves)
BENCH_SCRIPTS = sorted((ROOT / "scripts").glob("bench_*.py"))


def test_sim_and_bench_scripts_import_no_engine() -> None:
    """The simulator and the benchmarks use core/, never engine/ (one mechanism, one place)."""
    assert _violations(PKG / "sim", TORCH_FREE_MECHANISM) == []
    assert BENCH_SCRIPTS, "no scripts/bench_*.py found"
    for script in BENCH_SCRIPTS:
        assert _violations(script, ("sglang_pd.engine",)) == []


def test_sim_and_scheduler_benches_load_no_torch_or_engine_transitively() -> None:
    """Direct imports are not enough: what importing them actually loads must stay torch-free."""
    code = (
        "import importlib, importlib.util, pkgutil, sys\n"
        "import sglang_pd.sim as sim\n"
        "for m in pkgutil.walk_packages(sim.__path__, 'sglang_pd.sim.'):\n"
        "    importlib.import_module(m.name)\n"
        "for i, p in enumerate(sys.argv[1:]):\n"
        "    spec = importlib.util.spec_from_file_location(f'_bench{i}', p)\n"
        "    spec.loader.exec_module(importlib.util.module_from_spec(spec))\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] == 'torch'\n"
        "             or m.startswith('sglang_pd.engine')))\n"
    )
    scripts = [str(ROOT / "scripts" / n) for n in ("bench_scheduler.py", "bench_prefill_decision.py")]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [str(ROOT / "python"), str(ROOT / "router"), os.environ.get("PYTHONPATH", "")])}
    out = subprocess.run([sys.executable, "-c", code, *scripts], capture_output=True, text=True,
                         env=env, timeout=120, check=True)
    assert out.stdout.strip() == "[]", out.stdout + out.stderr


def test_models_know_no_loop_or_http() -> None:
    forbidden = ("zmq", "fastapi", "uvicorn", "aiohttp", "asyncio", "sglang_pd.engine.engine_core",
                 "sglang_pd.core.scheduler", "sglang_pd.engine.engine_process", "sglang_pd.frontend",
                 "sglang_pd.entrypoints", "sglang_pd.scheduling", "sglang_pd.disaggregation")
    assert _violations(PKG / "models", forbidden) == []


def test_from_package_import_module_form_is_caught(tmp_path: Path) -> None:
    bad = tmp_path / "bad.py"
    bad.write_text("from sglang_pd import engine\n")
    assert "sglang_pd.engine" in _imports(bad)


GPU_LIBS = ("triton", "flashinfer", "sgl_pd_kernel.triton_attention", "sgl_pd_kernel.triton_fused",
            "sglang_pd.engine.attention.triton_backend", "sglang_pd.engine.attention.flashinfer_backend")
# the only modules allowed to import those at import time: each is itself imported lazily
GPU_MODULES = {"python/sglang_pd/engine/attention/triton_backend.py",
               "python/sglang_pd/engine/attention/flashinfer_backend.py",
               "sgl-kernel/sgl_pd_kernel/triton_attention.py",
               "sgl-kernel/sgl_pd_kernel/triton_fused.py",
               "sgl-kernel/bench_attention.py"}  # a GPU script, never imported


def _top_level_imports(path: Path) -> set[str]:
    """Imports that run when the module is imported (module body, if/try blocks included)."""
    names: set[str] = set()
    todo = list(ast.parse(path.read_text()).body)
    while todo:
        node = todo.pop()
        if isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
            names.update(f"{node.module}.{a.name}" for a in node.names)
        elif isinstance(node, (ast.If, ast.Try)):
            todo.extend(node.body + node.orelse + getattr(node, "finalbody", [])
                        + [s for h in getattr(node, "handlers", []) for s in h.body])
    return names


def test_gpu_libraries_load_only_inside_backend_factories() -> None:
    bad = []
    for path in [*PKG.rglob("*.py"), *(ROOT / "sgl-kernel").rglob("*.py")]:
        rel = str(path.relative_to(ROOT))
        if rel in GPU_MODULES:
            continue
        for name in _top_level_imports(path):
            if any(name == f or name.startswith(f + ".") for f in GPU_LIBS):
                bad.append(f"{rel} imports {name} at import time")
    assert bad == []
