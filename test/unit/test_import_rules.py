"""DESIGN.md section 1 import rules, checked with ast."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PKG = ROOT / "python" / "sglang_pd"


def _imports(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
    return names


def _violations(folder: Path, forbidden: tuple[str, ...]) -> list[str]:
    bad = []
    for path in folder.rglob("*.py"):
        for name in _imports(path):
            if any(name == f or name.startswith(f + ".") for f in forbidden):
                bad.append(f"{path.relative_to(ROOT)} imports {name}")
    return bad


def test_scheduling_is_pure() -> None:
    forbidden = ("torch", "zmq", "sglang_pd.engine", "sglang_pd.models", "sglang_pd.disaggregation",
                 "sglang_pd.entrypoints", "socket", "aiohttp")
    assert _violations(PKG / "scheduling", forbidden) == []


def test_frontend_never_imports_engine_or_models() -> None:
    forbidden = ("sglang_pd.engine", "sglang_pd.models", "torch")
    assert _violations(PKG / "frontend", forbidden) == []
    assert _violations(PKG / "entrypoints", forbidden) == []


def test_router_has_no_torch_or_server_internals() -> None:
    forbidden = ("torch", "sglang_pd.engine", "sglang_pd.models")
    assert _violations(ROOT / "router", forbidden) == []


def test_protocol_is_plain_data() -> None:
    assert _imports(PKG / "protocol.py") <= {"__future__", "typing", "msgspec"}
