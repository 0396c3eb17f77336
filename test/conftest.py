"""Shared fixtures: the project's tiny models and one colocated server per test session."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Iterator

import pytest

from server_utils import ServerHandle, start_server

os.environ.setdefault("UCX_NET_DEVICES", "lo")
os.environ.setdefault("NIXL_LOG_LEVEL", "WARN")

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
