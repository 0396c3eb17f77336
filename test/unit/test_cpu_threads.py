"""The engine's CPU thread count (engine/cpu_tuning.py): one core is left to the frontend,
router and clients, an explicit setting wins, and the count really reaches torch."""

from __future__ import annotations

import pytest
import torch

from sglang_pd.engine.cpu_tuning import RESERVED_CORES, engine_threads, tune_threads


def test_auto_leaves_one_core_to_the_rest() -> None:
    assert engine_threads({}, cores=2) == 1
    assert engine_threads({}, cores=16) == 16 - RESERVED_CORES
    assert engine_threads({}, cores=1) == 1  # never zero threads


def test_explicit_settings_win() -> None:
    assert engine_threads({"SGLANG_PD_CPU_THREADS": "3"}, cores=2) == 3
    assert engine_threads({"OMP_NUM_THREADS": "2"}, cores=8) is None  # torch already honours it
    # ours wins over OMP_NUM_THREADS (it is the engine's own knob)
    assert engine_threads({"SGLANG_PD_CPU_THREADS": "1", "OMP_NUM_THREADS": "4"}, cores=8) == 1
    with pytest.raises(ValueError, match="SGLANG_PD_CPU_THREADS"):
        engine_threads({"SGLANG_PD_CPU_THREADS": "0"}, cores=8)


def test_tune_threads_sets_torch(monkeypatch: pytest.MonkeyPatch) -> None:
    before = torch.get_num_threads()
    try:
        monkeypatch.setenv("SGLANG_PD_CPU_THREADS", "1")
        assert tune_threads() == 1 and torch.get_num_threads() == 1
    finally:
        torch.set_num_threads(before)
