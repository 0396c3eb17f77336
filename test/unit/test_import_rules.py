"""DESIGN.md section 1 import rules, checked with ast."""

from __future__ import annotations

import ast
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
    assert _violations(PKG / "core", forbidden) == []  # the torch-free mechanism (DESIGN.md section 1)


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
    assert {n.split(".")[0] for n in _imports(PKG / "protocol.py")} <= {"__future__", "typing", "math", "msgspec"}


TORCH_FREE_MECHANISM = ("torch", "zmq", "sglang_pd.models", "sglang_pd.disaggregation",
                        "sglang_pd.entrypoints", "sglang_pd.frontend", "sglang_pd.engine.engine_core",
                        "sglang_pd.engine.model_runner", "sglang_pd.engine.forward_batch")


def test_scheduler_and_allocator_are_torch_free() -> None:
    """The simulator drives the very same Scheduler: it may not pull torch or the runtime."""
    for name in ("scheduler.py", "page_allocator.py", "pd_rules.py", "load_signals.py"):
        assert _violations(PKG / "engine" / name, TORCH_FREE_MECHANISM) == []


def test_sim_is_torch_free() -> None:
    assert _violations(PKG / "sim", TORCH_FREE_MECHANISM) == []


def test_sim_uses_only_the_torch_free_engine_mechanism() -> None:
    """sim/ drives the engine's Scheduler, allocator and PD rules, nothing else of the engine."""
    allowed = {"sglang_pd.engine.scheduler", "sglang_pd.engine.page_allocator", "sglang_pd.engine.pd_rules",
               "sglang_pd.engine.load_signals"}
    bad = []
    for path in (PKG / "sim").rglob("*.py"):
        for name in _imports(path):
            if name.startswith("sglang_pd.engine") and name not in allowed and name.rsplit(".", 1)[0] not in allowed:
                bad.append(f"{path.relative_to(ROOT)} imports {name}")
    assert bad == []


def test_models_know_no_loop_or_http() -> None:
    forbidden = ("zmq", "fastapi", "uvicorn", "aiohttp", "asyncio", "sglang_pd.engine.engine_core",
                 "sglang_pd.engine.scheduler", "sglang_pd.engine.engine_process", "sglang_pd.frontend",
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
