"""scripts/bench_cluster_setups.py: the setups bench_cluster compares, with two prefill servers
(the issue's cluster) or one (each engine a core of its own on a 2-core host)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

SCRIPTS = Path(__file__).resolve().parents[2] / "scripts"
if str(SCRIPTS) not in sys.path:
    sys.path.insert(0, str(SCRIPTS))

import bench_cluster as bc  # noqa: E402
from bench_cluster_setups import AS_SGLANG_PREFILL, POOL_SETUPS, cluster_setups  # noqa: E402


def _flag(flags: tuple[str, ...], name: str) -> str:
    return flags[flags.index(name) + 1]


def test_two_prefills_give_ours_a_short_and_a_long_pool() -> None:
    setups = cluster_setups(4)
    assert [_flag(p, "--prefill-role") for p in setups["ours"].prefill] == ["short", "long"]
    assert [_flag(p, "--prefill-role") for p in setups["ours-no-pools"].prefill] == ["both", "both"]
    assert all(len(s.prefill) == 2 for s in setups.values())


def test_one_prefill_keeps_every_policy_on_a_single_server() -> None:
    two, one = cluster_setups(4), cluster_setups(4, prefills=1)
    assert set(two) - set(one) == set(POOL_SETUPS)  # nothing to move between pools with one prefill
    for name, s in one.items():
        assert len(s.prefill) == 1, name
        assert s.prefill[0] == two[name].prefill[-1] or s.router == "ours", name  # baselines: same flags
        assert (s.router, s.decode, s.router_flags) == (two[name].router, two[name].decode, two[name].router_flags)
    ours = one["ours"].prefill[0]
    assert _flag(ours, "--prefill-role") == "both" and _flag(ours, "--prefill-queues") == "dual"
    assert _flag(ours, "--prefill-policy") == "kairos+"
    assert one["sglang-pd"].prefill[0][-2:] == AS_SGLANG_PREFILL  # still answers as SGLang's prefill
    with pytest.raises(ValueError):
        cluster_setups(4, prefills=3)


def test_one_prefill_takes_no_pin_layout_but_shared(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        bc.main(["--prefills", "1", "--pin-layout", "split", "--list"])
    assert bc.main(["--prefills", "1", "--list"]) == 0
    listed = capsys.readouterr().out
    assert "ours " in listed and "ours+spill" not in listed
