"""Packaging: serving needs no matplotlib; the router installs alone without torch."""

from __future__ import annotations

import ast
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PKG = ROOT / "python" / "sglang_pd"
SERVER_MODULES = ("sglang_pd.entrypoints.http_server", "sglang_pd.engine.engine_core",
                  "sglang_pd.launch_server")
PLOT_MODULES = {"matplotlib", "pyinstrument"}  # the `bench` extra (transformers: tests only)


def _names(reqs: list[str]) -> set[str]:
    """Distribution names of requirement strings, lower-case, without versions or markers."""
    return {re.split(r"[\s;<>=!~\[]", r, maxsplit=1)[0].lower() for r in reqs}


def _requirements(pyproject: Path) -> tuple[set[str], dict[str, set[str]]]:
    """(base dependency names, extra -> names) of a pyproject.toml."""
    tomllib = pytest.importorskip("tomllib", reason="tomllib is in the standard library from 3.11")
    project = tomllib.loads(pyproject.read_text())["project"]
    extras = {k: _names(v) for k, v in project.get("optional-dependencies", {}).items()}
    return _names(project["dependencies"]), extras


def test_declared_dependencies():
    base, extras = _requirements(ROOT / "pyproject.toml")
    assert not base & PLOT_MODULES, "serving must not depend on plotting libraries"
    assert "matplotlib" in extras["bench"] and "matplotlib" in extras["test"]  # plot tests run
    assert "tqdm" in base  # bench_serving's progress bar (sglang_pd/bench/runner.py)
    router, router_extras = _requirements(ROOT / "router" / "pyproject.toml")
    # httptools: the legs' HTTP/1.1 parser (leg_conn.py), a small C extension uvicorn uses too
    allowed = {"aiohttp", "orjson", "uvloop", "tokenizers", "prometheus-client", "msgspec", "httptools"}
    assert router <= allowed, f"router dependencies beyond the light set: {router - allowed}"
    assert not router_extras


def test_server_imports_no_plotting():
    code = ("import sys\n"
            + "".join(f"import {m}\n" for m in SERVER_MODULES)
            + f"bad = sorted(m for m in sys.modules if m.split('.')[0] in {sorted(PLOT_MODULES)!r})\n"
            + "assert not bad, bad\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-3000:]


def test_plot_flag_without_matplotlib_fails_before_the_run(monkeypatch, tmp_path):
    from sglang_pd.bench.cli import build_parser, validate

    args = build_parser().parse_args(["--plot", str(tmp_path)])
    validate(args)  # matplotlib is installed with the test extra
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # as if it were not
    with pytest.raises(ValueError, match=r"--plot needs matplotlib.*\[bench\]"):
        validate(build_parser().parse_args(["--plot", str(tmp_path)]))
    validate(build_parser().parse_args([]))  # no --plot: no matplotlib needed


def _module_level_imports(tree: ast.Module) -> list[str]:
    """Imports executed when the module is imported (not inside a function or class body)."""
    out: list[str] = []
    todo: list[ast.AST] = list(tree.body)
    while todo:
        node = todo.pop()
        if isinstance(node, ast.Import):
            out += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module:
            out.append(node.module)
            out += [f"{node.module}.{a.name}" for a in node.names]
        elif isinstance(node, (ast.If, ast.Try, ast.With)):  # still module level
            for field in ("body", "orelse", "finalbody", "handlers"):
                todo += getattr(node, field, [])
        elif isinstance(node, ast.ExceptHandler):
            todo += node.body
    return out


def test_only_bench_plots_imports_matplotlib_at_module_level():
    offenders = []
    for path in PKG.rglob("*.py"):
        rel = path.relative_to(PKG.parent).as_posix()
        if rel == "sglang_pd/bench/plots.py":
            continue
        for name in _module_level_imports(ast.parse(path.read_text(), str(path))):
            if name.split(".")[0] in PLOT_MODULES or name.startswith("sglang_pd.bench.plots"):
                offenders.append(f"{rel}: {name}")
    assert not offenders, "plotting imported at module level (import it lazily): " + ", ".join(offenders)


_NO_INDEX = ("No matching distribution found", "Could not find a version", "NewConnectionError",
             "Network is unreachable", "Temporary failure in name resolution", "ConnectTimeout",
             "Failed to establish a new connection", "ProxyError")


@pytest.mark.slow  # a networked `pip install` (minutes, needs an index): not in the CI suite
def test_router_installs_alone_without_torch(tmp_path):
    venv = tmp_path / "venv"
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME")}
    t0 = time.monotonic()
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120, env=env)
    py = venv / ("Scripts/python.exe" if os.name == "nt" else "bin/python")
    src = tmp_path / "router"  # a copy: an in-tree build would leave build/ in the checkout
    shutil.copytree(ROOT / "router", src, ignore=shutil.ignore_patterns("build", "*.egg-info",
                                                                        "__pycache__"))
    r = subprocess.run([str(py), "-m", "pip", "install", "-q", str(src)], capture_output=True,
                       text=True, timeout=600, env=env, cwd=tmp_path)
    if r.returncode != 0:
        out = r.stdout + r.stderr
        why = next((line.strip() for line in out.splitlines() if any(s in line for s in _NO_INDEX)),
                   None)
        if why is not None:
            pytest.skip(f"pip cannot reach a package index: {why[:200]}")
        pytest.fail(f"pip install ./router failed:\n{out[-3000:]}")
    # every module of the installed router (its CLI, server, policies as they land), so that
    # one of them importing the server package or torch fails here
    code = ("import importlib, importlib.util, pkgutil, sys, sglang_pd_router\n"
            "for m in pkgutil.walk_packages(sglang_pd_router.__path__, 'sglang_pd_router.'):\n"
            "    if not m.name.endswith('__main__'):\n"
            "        importlib.import_module(m.name)\n"
            "assert 'torch' not in sys.modules, 'importing the router pulled torch'\n"
            "assert importlib.util.find_spec('torch') is None, 'torch was installed'\n"
            "assert importlib.util.find_spec('sglang_pd') is None, 'the server package came along'\n"
            "print(sglang_pd_router.__file__, sglang_pd_router.__version__)\n")
    r = subprocess.run([str(py), "-c", code], capture_output=True, text=True, timeout=120, env=env,
                       cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    assert str(venv) in r.stdout  # the installed copy, not the checkout's
    print(f"router venv + install + import: {time.monotonic() - t0:.1f} s")
