from __future__ import annotations

import math

import pytest
import torch
from torch.overrides import TorchFunctionMode

from sglang_pd.engine import sampler
from sglang_pd.engine.request import Req
from sglang_pd.engine.sampler import sample
from sglang_pd.protocol import SamplingParams


def _req(out: list[int] | None = None, prompt: list[int] | None = None, **params) -> Req:
    return Req(rid="r", prompt_ids=prompt or [0], params=SamplingParams(**params), arrival=0.0,
               output_ids=list(out or []))


def test_greedy_is_argmax() -> None:
    logits = torch.tensor([[0.1, 2.0, 0.3], [5.0, 1.0, 0.0]])
    out = sample(logits, [_req(temperature=0.0), _req(top_k=1)], eos_ids=[])
    assert out.token_ids == [1, 0]


def test_top_k_and_top_p_restrict_support() -> None:
    torch.manual_seed(0)
    logits = torch.tensor([[3.0, 2.9, 2.8, -1.0, -2.0]]).repeat(400, 1)
    reqs = [_req(temperature=1.0, top_k=2) for _ in range(400)]
    assert set(sample(logits, reqs, []).token_ids) == {0, 1}
    probs = logits[0].softmax(-1)
    # top_p just above p0 keeps only tokens 0 and 1
    reqs = [_req(temperature=1.0, top_p=float(probs[0]) + 0.01) for _ in range(400)]
    assert set(sample(logits, reqs, []).token_ids) == {0, 1}


def test_min_p_drops_unlikely_tokens() -> None:
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05]])).repeat(300, 1)
    out = sample(logits, [_req(temperature=1.0, min_p=0.2) for _ in range(300)], [])
    assert set(out.token_ids) == {0, 1, 2}  # 0.05 < 0.2 * 0.5


def test_seeded_rows_are_reproducible_and_batch_independent() -> None:
    logits = torch.randn(1, 50)
    a = sample(logits, [_req(temperature=1.0, seed=42)], []).token_ids
    b = sample(torch.cat([torch.randn(3, 50), logits]),
               [_req(temperature=1.0) for _ in range(3)] + [_req(temperature=1.0, seed=42)], []).token_ids
    assert a[0] == b[3]


def test_sampling_follows_the_distribution() -> None:
    torch.manual_seed(1)
    p = torch.tensor([0.6, 0.3, 0.1])
    n = 6000
    toks = sample(torch.log(p).repeat(n, 1), [_req(temperature=1.0) for _ in range(n)], []).token_ids
    freq = torch.bincount(torch.tensor(toks), minlength=3).float() / n
    assert torch.allclose(freq, p, atol=0.03)


def test_penalties_change_the_choice() -> None:
    logits = torch.tensor([[2.0, 1.9, 0.0]])
    assert sample(logits, [_req(temperature=0.0)], []).token_ids == [0]
    assert sample(logits, [_req([0], temperature=0.0, frequency_penalty=0.5)], []).token_ids == [1]
    assert sample(logits, [_req([0], temperature=0.0, presence_penalty=0.5)], []).token_ids == [1]
    assert sample(logits, [_req(prompt=[0], temperature=0.0, repetition_penalty=1.2)], []).token_ids == [1]


def test_min_new_tokens_blocks_eos() -> None:
    logits = torch.tensor([[5.0, 1.0, 0.0]])
    assert sample(logits, [_req(temperature=0.0, min_new_tokens=2)], eos_ids=[0]).token_ids == [1]
    assert sample(logits, [_req([1, 1], temperature=0.0, min_new_tokens=2)], eos_ids=[0]).token_ids == [0]


def test_logprobs_are_raw_model_logprobs() -> None:
    logits = torch.tensor([[1.0, 2.0, 3.0]])
    r = _req(temperature=0.0)
    r.return_logprob, r.top_logprobs_num = True, 2
    out = sample(logits, [r], [])
    ref = torch.log_softmax(logits, -1)[0]
    assert out.token_ids == [2]
    assert math.isclose(out.logprobs[0], float(ref[2]), rel_tol=1e-6)
    assert [t for _, t in out.top_logprobs[0]] == [2, 1]


# ---- issue 22: one request's extreme (but valid) settings must not fail or poison the batch
def test_top_logprobs_past_the_vocabulary_are_capped() -> None:
    logits = torch.tensor([[1.0, 2.0, 3.0], [0.0, 0.0, 1.0]])
    big, small = _req(temperature=0.0), _req(temperature=0.0)
    big.return_logprob, big.top_logprobs_num = True, 7000
    small.return_logprob, small.top_logprobs_num = True, 1
    out = sample(logits, [big, small], [])
    assert [t for _, t in out.top_logprobs[0]] == [2, 1, 0]
    assert [t for _, t in out.top_logprobs[1]] == [2]


def test_top_k_past_the_vocabulary_keeps_every_token() -> None:
    """top_k = 2**64 - 1 is a valid uint64 but overflowed the int64 top-k tensor."""
    torch.manual_seed(0)
    logits = torch.zeros(300, 3)
    reqs = [_req(temperature=1.0, top_k=2**64 - 1) for _ in range(299)] + [_req(temperature=1.0, top_k=1)]
    toks = sample(logits, reqs, []).token_ids
    assert set(toks[:-1]) == {0, 1, 2} and toks[-1] == 0


def test_huge_temperature_never_draws_a_blocked_token() -> None:
    """-inf / inf was NaN: the whole row became NaN and the blocked EOS (index 0) was drawn."""
    torch.manual_seed(0)
    logits = torch.tensor([[5.0, 1.0, 0.0]]).repeat(200, 1)
    reqs = [_req(temperature=1e300, min_new_tokens=5) for _ in range(200)]
    assert 0 not in sample(logits, reqs, eos_ids=[0]).token_ids


def test_out_of_vocabulary_eos_ids_are_ignored_when_blocking() -> None:
    logits = torch.tensor([[5.0, 1.0, 0.0]])
    assert sample(logits, [_req(temperature=0.0, min_new_tokens=2)], eos_ids=[0, 99]).token_ids == [1]


def test_tiny_repetition_penalty_does_not_overflow() -> None:
    """A positive logit / 1e-40 was inf in float32, and softmax of inf is NaN (token 0 drawn)."""
    torch.manual_seed(0)
    logits = torch.tensor([[1.0, 2.0, 0.5]]).repeat(50, 1)
    reqs = [_req(prompt=[1], temperature=1.0, repetition_penalty=1e-40) for _ in range(50)]
    assert set(sample(logits, reqs, []).token_ids) == {1}


# ---- issue 29: everything on the logits' device ---------------------------------------------
class _RecordDevices(TorchFunctionMode):
    """Records the device of every tensor a torch call returns while the mode is active."""

    def __init__(self) -> None:
        super().__init__()
        self.devices: dict[str, set[str]] = {}

    def __torch_function__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        out = func(*args, **(kwargs or {}))
        for t in out if isinstance(out, tuple) else (out,):
            if isinstance(t, torch.Tensor):
                self.devices.setdefault(t.device.type, set()).add(getattr(func, "__name__", str(func)))
        return out


def test_every_tensor_the_sampler_makes_is_on_the_logits_device(monkeypatch: pytest.MonkeyPatch) -> None:
    """With logits on a fake device (meta), a tensor made on the CPU either fails to mix with
    them or shows up in the record. Only the final host copies (tolist) leave the device; here
    they read back zeros."""
    real_tolist = torch.Tensor.tolist

    def zeros(shape: tuple[int, ...]) -> list:  # type: ignore[type-arg]
        return [0] * shape[0] if len(shape) == 1 else [zeros(shape[1:]) for _ in range(shape[0])]

    def fake_tolist(t: torch.Tensor):  # type: ignore[no-untyped-def]
        return zeros(tuple(t.shape)) if t.device.type == "meta" else real_tolist(t)

    monkeypatch.setattr(torch.Tensor, "tolist", fake_tolist)
    logprob_req = _req(temperature=0.0)
    logprob_req.return_logprob, logprob_req.top_logprobs_num = True, 3
    reqs = [logprob_req,
            _req(temperature=0.7, top_k=5),
            _req(temperature=1.3, top_p=0.8),
            _req([4], prompt=[1, 2], temperature=1.0, min_p=0.1, repetition_penalty=1.3, min_new_tokens=3),
            _req(temperature=0.5, top_k=4, top_p=0.9)]
    logits = torch.randn(len(reqs), 50, device="meta")
    with _RecordDevices() as record:
        out = sample(logits, reqs, eos_ids=[7])
    assert set(record.devices) == {"meta"}, record.devices
    assert len(out.token_ids) == len(reqs) and len(out.top_logprobs[0]) == 3


def test_top_p_uses_the_candidates_without_sorting_the_vocabulary(monkeypatch: pytest.MonkeyPatch) -> None:
    """A top-p row over a large vocabulary: no full sort, and the nucleus is still exact when it
    closes inside the candidates."""
    vocab = 4 * sampler.TOP_P_CANDIDATES
    logits = torch.full((300, vocab), -30.0)
    logits[:, :3] = torch.tensor([3.0, 2.9, 2.8])
    probs = logits[0].softmax(-1)

    def no_sort(*a, **k):  # type: ignore[no-untyped-def]
        raise AssertionError("the sampler sorted the whole vocabulary")

    monkeypatch.setattr(torch.Tensor, "sort", no_sort)
    torch.manual_seed(0)
    reqs = [_req(temperature=1.0, top_p=float(probs[0]) + 0.01) for _ in range(300)]
    assert set(sample(logits, reqs, []).token_ids) == {0, 1}
    # a flat row whose candidates hold less than top_p is left whole, not sorted
    flat = sample(torch.zeros(2000, vocab), [_req(temperature=1.0, top_p=0.5) for _ in range(2000)], [])
    assert max(flat.token_ids) >= sampler.TOP_P_CANDIDATES


# ---- HF transformers' logits processors as the reference (issue 32)
def _hf():
    from transformers import generation as g  # in the test extra
    return g


def test_penalties_match_hf_and_openai_on_random_cases() -> None:
    """Greedy picks after penalties equal the argmax of the reference: HF's
    RepetitionPenaltyLogitsProcessor over prompt + output, and OpenAI's frequency/presence
    formula (logit - f * count - p * [count > 0], output only). Random logits, ids and settings,
    both signs of each penalty."""
    g = _hf()
    rng = torch.Generator().manual_seed(3)
    vocab, n = 12, 300
    logits = torch.randn(n, vocab, generator=rng) * 2
    reqs, ref = [], logits.clone()
    for i in range(n):
        prompt = torch.randint(0, vocab, (int(torch.randint(1, 6, (1,), generator=rng)),), generator=rng).tolist()
        out = torch.randint(0, vocab, (int(torch.randint(0, 8, (1,), generator=rng)),), generator=rng).tolist()
        rep = [1.0, 1.3, 0.7, 2.0][i % 4]
        freq, pres = [(0.0, 0.0), (0.6, 0.0), (0.0, 0.9), (-0.5, 0.4), (0.3, -0.7)][i % 5]
        reqs.append(_req(out, prompt=prompt, temperature=0.0, repetition_penalty=rep,
                         frequency_penalty=freq, presence_penalty=pres))
        row = ref[i:i + 1]
        if rep != 1.0:
            row = g.RepetitionPenaltyLogitsProcessor(rep)(torch.tensor([prompt + out]), row)
        counts = torch.bincount(torch.tensor(out, dtype=torch.long), minlength=vocab).float()
        ref[i] = row[0] - freq * counts - pres * (counts > 0).float()
    got = sample(logits, reqs, []).token_ids
    want = ref.argmax(-1).tolist()
    assert got == want
    # the cases are not vacuous: the penalties changed many of the picks
    assert sum(a != b for a, b in zip(want, logits.argmax(-1).tolist())) > n // 10


def test_penalty_signs() -> None:
    """A positive penalty lowers a repeated token (both signs of its logit), a negative
    frequency/presence penalty raises it; repetition_penalty < 1 raises it."""
    logits = torch.tensor([[1.0, 0.9, -5.0]])
    assert sample(logits, [_req([0], temperature=0.0, frequency_penalty=0.2)], []).token_ids == [1]
    assert sample(logits, [_req([1], temperature=0.0, frequency_penalty=-0.2)], []).token_ids == [1]
    assert sample(logits, [_req([1], temperature=0.0, presence_penalty=-0.2)], []).token_ids == [1]
    assert sample(logits, [_req(prompt=[0], temperature=0.0, repetition_penalty=1.2)], []).token_ids == [1]
    assert sample(logits, [_req(prompt=[1], temperature=0.0, repetition_penalty=0.8)], []).token_ids == [1]
    neg = torch.tensor([[-1.0, -1.1, -5.0]])  # a negative logit is multiplied: lower still
    assert sample(neg, [_req(prompt=[0], temperature=0.0, repetition_penalty=1.2)], []).token_ids == [1]


@pytest.mark.parametrize("settings", [
    {"temperature": 0.7, "top_k": 3},
    {"temperature": 1.3, "top_p": 0.8},
    {"temperature": 1.0, "min_p": 0.15},
    {"temperature": 0.8, "top_p": 0.9, "min_p": 0.12},
    {"temperature": 0.8, "top_k": 4, "min_p": 0.12},
    pytest.param({"temperature": 0.8, "top_k": 5, "top_p": 0.9, "min_p": 0.05}, marks=pytest.mark.xfail(
        strict=True, reason="engine/sampler.py takes top-p's mass over the whole distribution, "
        "HF's TopPLogitsWarper over what top-k left (renormalised): with both set, token 4 "
        "stays here and not in HF (SGLang's torch path does as we do; the docstring says HF's order)")),
])
def test_filters_match_hf_warpers(settings: dict) -> None:
    """Temperature, top-k, top-p and min-p against HF's warpers (in HF's order): the tokens drawn
    are exactly HF's support and their frequencies HF's probabilities (8000 seeded draws)."""
    g = _hf()
    logits = torch.tensor([[2.0, 1.6, 1.3, 1.0, 0.4, 0.0, -0.7, -2.0]])
    scores = g.TemperatureLogitsWarper(settings["temperature"])(None, logits.clone())
    if "top_k" in settings:
        scores = g.TopKLogitsWarper(settings["top_k"])(None, scores)
    if "top_p" in settings:
        scores = g.TopPLogitsWarper(settings["top_p"])(None, scores)
    if "min_p" in settings:
        scores = g.MinPLogitsWarper(settings["min_p"])(None, scores)
    want = scores.softmax(-1)[0]
    support = set(torch.nonzero(want).flatten().tolist())
    assert 1 < len(support) < 8  # each case removes some tokens and keeps several
    torch.manual_seed(5)
    n = 8000
    toks = sample(logits.repeat(n, 1), [_req(**settings) for _ in range(n)], []).token_ids
    assert set(toks) == support
    freq = torch.bincount(torch.tensor(toks), minlength=8).float() / n
    assert torch.allclose(freq, want, atol=0.02), (freq, want)
