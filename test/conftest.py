"""Shared fixtures (the project's tiny models, one colocated server per test session) and the
required-components check: with ``SGLANG_PD_REQUIRED`` set (scripts/test.sh sets it, as CI runs
it) a missing component stops the run at start-up, naming it, and a test that skips for want of
one fails instead."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from collections.abc import Iterator

import pytest

from server_utils import ServerHandle, start_server

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))
from check_components import COMPONENTS, SKIP_WORDS, missing, parse_names

os.environ.setdefault("UCX_NET_DEVICES", "lo")
os.environ.setdefault("NIXL_LOG_LEVEL", "WARN")



def _required() -> list[str]:
    try:
        return parse_names(os.environ.get("SGLANG_PD_REQUIRED"))
    except ValueError as e:
        raise pytest.UsageError(f"SGLANG_PD_REQUIRED: {e}") from None


def pytest_configure(config: pytest.Config) -> None:
    bad = {n: why for n in _required() if (why := missing(n)) is not None}
    if bad:
        lines = [f"{n.upper()} is missing: {why} (install {COMPONENTS[n][2]})" for n, why in bad.items()]
        raise pytest.UsageError("SGLANG_PD_REQUIRED names components this environment lacks; their "
                                "tests would all skip:\n  " + "\n  ".join(lines) +
                                "\n(opt out with SGLANG_PD_ALLOW_MISSING=<names> where they cannot install)")


def _required_component_in(reason: str) -> str | None:
    low = reason.lower()
    return next((n for n in _required() if any(w in low for w in SKIP_WORDS[n])), None)


def _fail_required_skip(report: pytest.CollectReport | pytest.TestReport) -> None:
    if not report.skipped or not isinstance(report.longrepr, tuple):
        return
    reason = str(report.longrepr[2])
    name = _required_component_in(reason)
    if name is not None:
        report.outcome = "failed"
        report.longrepr = f"skipped, but {name} is required (SGLANG_PD_REQUIRED): {reason}"


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo):
    outcome = yield
    report = outcome.get_result()
    if not hasattr(report, "wasxfail"):
        _fail_required_skip(report)


@pytest.hookimpl(hookwrapper=True)
def pytest_make_collect_report(collector: pytest.Collector):
    outcome = yield
    _fail_required_skip(outcome.get_result())


# Small settings that exercise chunking and many pages on the tiny model.
SMALL_SERVER_FLAGS = ("--page-size", "4", "--chunked-prefill-size", "64", "--max-total-tokens", "32768",
                      "--max-running-requests", "128")


@pytest.fixture(scope="session")
def tiny_models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """arch -> model dir; built lazily, once per session."""
    return {}


@pytest.fixture(scope="session")
def tiny_model_factory(tmp_path_factory: pytest.TempPathFactory, tiny_models: dict[str, str]):
    from sglang_pd.tools.make_tiny_model import make_tiny_model

    def get(arch: str = "llama") -> str:
        if arch not in tiny_models:
            out = tmp_path_factory.mktemp(f"tiny-{arch}")
            tiny_models[arch] = str(make_tiny_model(out, arch))
        return tiny_models[arch]

    return get


@pytest.fixture(scope="session")
def tiny_llama_kv1(tmp_path_factory: pytest.TempPathFactory) -> str:
    """The tiny llama with one KV head: fewer KV heads than tensor-parallel ranks."""
    from sglang_pd.tools.make_tiny_model import TinySpec, make_tiny_model

    return str(make_tiny_model(tmp_path_factory.mktemp("tiny-llama-kv1"), "llama",
                               spec=TinySpec(num_kv_heads=1)))


@pytest.fixture(scope="session")
def tiny_model_dir(tiny_model_factory) -> str:
    return tiny_model_factory("llama")


@pytest.fixture(scope="session")
def colocated_server(tiny_model_dir: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerHandle]:
    handle = start_server(tiny_model_dir, tmp_path_factory.mktemp("logs"), "--mode", "colocated",
                          *SMALL_SERVER_FLAGS)
    try:
        yield handle
    finally:
        handle.stop()
