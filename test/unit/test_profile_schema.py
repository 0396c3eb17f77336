"""The cost-model profile schema (scheduling/profile.py, docs/profile.md)."""

from __future__ import annotations

import copy
import json
import re
import sys
from pathlib import Path

import pytest

from sglang_pd.scheduling.config import PolicyConfig
from sglang_pd.scheduling.cost_model import DEFAULT_PREFILL_PRIOR, PrefillCostModel
from sglang_pd.scheduling.profile import (
    SCHEMA_VERSION, Profile, ProfileError, decode_profile, dump_profile, load_profile)

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "docs" / "profiles" / "example_llama8b_h100.json"


def _raw() -> dict:
    return json.loads(EXAMPLE.read_text())


def _load(raw: dict, tmp_path: Path) -> Profile:
    path = tmp_path / "p.json"
    path.write_text(json.dumps(raw))
    return load_profile(path)


def test_example_loads_and_round_trips(tmp_path):
    prof = load_profile(EXAMPLE)
    assert prof.schema_version == SCHEMA_VERSION == 1
    assert prof.meta.page_size == 16 and prof.prefill.new_tokens == [16, 128, 1024, 8192]
    out = tmp_path / "out.json"
    dump_profile(prof, out)
    again = load_profile(out)
    assert again == prof
    assert out.read_bytes() == EXAMPLE.read_bytes()  # the example is in the writer's format
    assert prof.prefill.seconds[3][2] is None  # null cells survive
    assert (8, 1024, 0.007482) in list(prof.decode.cells())
    pts = list(prof.prefill.points())
    assert (16, 16 * 256, 0, 0.161564) in pts and len(pts) == 11 + 9


def test_doc_example_is_valid():
    text = (ROOT / "docs" / "profile.md").read_text()
    block = re.search(r"```json\n(.*?)```", text, re.S).group(1)
    prof = decode_profile(block)
    assert prof.prefill.coeffs.b == 3.8e-5 and prof.decode.context_key == "total"


def test_profile_module_is_pure():
    import subprocess
    code = ("import sys, sglang_pd.scheduling.profile, sglang_pd.scheduling.cost_model; "
            "assert 'torch' not in sys.modules")
    subprocess.run([sys.executable, "-c", code], check=True)


def _set(raw: dict, path: str, value) -> dict:
    raw = copy.deepcopy(raw)
    *parents, last = path.split(".")
    node = raw
    for k in parents:
        node = node[k]
    if value is _DEL:
        del node[last]
    else:
        node[last] = value
    return raw


_DEL = object()


@pytest.mark.parametrize("path,value,field,words", [
    ("schema_version", 2, "schema_version", "unsupported version 2"),
    ("schema_version", "1", "schema_version", "unsupported version '1'"),
    ("schema_version", _DEL, "schema_version", "missing"),
    ("prefill.new_tokens", [16, 16, 1024, 8192], "prefill.new_tokens[1]", "strictly ascending"),
    ("prefill.context_tokens", [4096, 0, 32768], "prefill.context_tokens[1]", "strictly ascending"),
    ("prefill.new_tokens", [0, 128, 1024, 8192], "prefill.new_tokens[0]", ">= 1"),
    ("prefill.new_tokens", [], "prefill.new_tokens", "empty"),
    ("decode.batch_sizes", [1, 8, 8, 128], "decode.batch_sizes[2]", "strictly ascending"),
    ("prefill.seconds", [[0.1, 0.2, 0.3]], "prefill.seconds", "expected 4"),
    ("decode.seconds", [[0.1, 0.1, 0.1, 0.1]] * 3 + [[0.1, 0.1]], "decode.seconds[3]", "expected 4"),
    ("prefill.batched.seconds", [[0.1, 0.1, 0.1]] * 2, "prefill.batched.seconds", "expected 3"),
    ("prefill.coeffs.a", -1.0, "prefill.coeffs.a", ">= 0"),
    ("meta.page_size", 0, "meta.page_size", ">= 1"),
    ("meta.created", "yesterday", "meta.created", "ISO 8601"),
    ("meta.device", _DEL, "meta", "device"),
    ("meta.page_size", "16", "meta.page_size", "Expected `int`"),
    ("prefill.new_tokens", [16.5, 128, 1024, 8192], "prefill.new_tokens[0]", "Expected `int`"),
    ("decode.context_key", "median", "decode.context_key", "median"),
    ("decode.colour", "red", "decode", "colour"),
    ("prefill.std_seconds", [[-0.1, 0, 0]] + [[0, 0, 0]] * 3, "prefill.std_seconds[0][0]", ">= 0"),
])
def test_validation_errors_name_the_field(tmp_path, path, value, field, words):
    with pytest.raises(ProfileError) as ei:
        _load(_set(_raw(), path, value), tmp_path)
    msg = str(ei.value)
    assert f"`{field}" in msg, msg
    assert words in msg, msg
    assert "1" in msg and ("schema_version" in msg or "supported" in msg), msg


@pytest.mark.parametrize("cell", [0.0, -0.004])
def test_times_must_be_positive(tmp_path, cell):
    raw = _raw()
    raw["prefill"]["seconds"][1][2] = cell
    with pytest.raises(ProfileError, match=r"`prefill\.seconds\[1\]\[2\]`.*> 0"):
        _load(raw, tmp_path)
    raw = _raw()
    raw["decode"]["seconds"][0][0] = cell
    with pytest.raises(ProfileError, match=r"`decode\.seconds\[0\]\[0\]`"):
        _load(raw, tmp_path)


def test_whole_file_errors(tmp_path):
    with pytest.raises(ProfileError, match="cannot read profile"):
        load_profile(tmp_path / "missing.json")
    (tmp_path / "bad.json").write_text("{not json")
    with pytest.raises(ProfileError, match="not valid JSON"):
        load_profile(tmp_path / "bad.json")
    with pytest.raises(ProfileError, match="JSON object"):
        decode_profile("[1, 2]")
    raw = _raw()
    raw["prefill"] = None
    raw["decode"] = None
    with pytest.raises(ProfileError, match=r"`prefill`.*or a `decode`"):
        _load(raw, tmp_path)
    raw = _raw()
    raw["decode"]["seconds"] = [[None] * 4] * 4
    with pytest.raises(ProfileError, match="no measured cell"):
        _load(raw, tmp_path)


def test_dump_refuses_invalid(tmp_path):
    prof = load_profile(EXAMPLE)
    prof.decode.batch_sizes = [8, 1, 32, 128]
    with pytest.raises(ProfileError, match=r"decode\.batch_sizes\[1\]"):
        dump_profile(prof, tmp_path / "x.json")
    assert not (tmp_path / "x.json").exists()


def test_cost_model_takes_the_profile_as_prior(tmp_path):
    # no profile: the built-in guess
    assert PrefillCostModel.from_config(PolicyConfig()).coeffs == DEFAULT_PREFILL_PRIOR
    # profile with coeffs: they are the prior, split included
    m = PrefillCostModel.from_config(PolicyConfig(cost_model_profile=str(EXAMPLE)))
    c = load_profile(EXAMPLE).prefill.coeffs
    assert (m.coeffs.launch_s, m.coeffs.a, m.coeffs.b, m.coeffs.g_w) == (c.launch_s, c.a, c.b, c.g_w)
    assert m.compute_share == pytest.approx(c.b / (c.b + c.g_w))
    assert m.request_s(1024, 4096) == pytest.approx(0.047444, rel=1e-3)
    # profile without coeffs: fitted to the grid, split unknown
    raw = _raw()
    raw["prefill"]["coeffs"] = None
    path = tmp_path / "nocoeffs.json"
    path.write_text(json.dumps(raw))
    m = PrefillCostModel.from_config(PolicyConfig(cost_model_profile=str(path)))
    assert m.compute_share is None and m.boundary_tokens() is None
    for l, row in zip(raw["prefill"]["new_tokens"], raw["prefill"]["seconds"]):
        for h, t in zip(raw["prefill"]["context_tokens"], row):
            if t is not None:
                assert m.step_s([(l, h)]) == pytest.approx(t, rel=0.02)
    assert m.step_s([(64, 0)] * 4) == pytest.approx(0.014066, rel=0.02)  # batched point
    # decode-only profile: the built-in prior
    raw = _raw()
    raw["prefill"] = None
    path.write_text(json.dumps(raw))
    assert PrefillCostModel.from_config(PolicyConfig(cost_model_profile=str(path))).coeffs == \
        DEFAULT_PREFILL_PRIOR
    # a bad profile path fails loudly at construction
    with pytest.raises(ProfileError):
        PrefillCostModel.from_config(PolicyConfig(cost_model_profile=str(tmp_path / "nope.json")))
