"""What one engine step is and what it held: modes, shapes, the bucket grid, step profiles.

Torch-free on purpose: the engine, the simulator, the cost models and the router's busy figure
all read these one definitions (DESIGN.md section 3).
"""

from __future__ import annotations

import bisect
import enum
from dataclasses import dataclass


class ForwardMode(enum.Enum):
    EXTEND = "extend"  # prefill or a prefill chunk: >= 1 new tokens per request
    DECODE = "decode"  # exactly one new token per request
    MIXED = "mixed"  # prefill chunks and decodes in one forward (--enable-mixed-chunk)


class ReqState(enum.Enum):
    WAITING = "waiting"  # queued for (more) prefill
    RUNNING = "running"  # decoding
    PARKED = "parked"  # held outside the queues by PD (pre-allocating, KV in flight)
    FINISHED = "finished"


@dataclass(frozen=True)
class BucketGrid:
    """Padded (L, B) shapes that short-prefill batches round up to and that CUDA graphs capture
    (PLA-Serve §3.1): B requests, each padded to L new tokens (the step runs L x B token slots).
    One grid, parsed once from ``--short-prefill-buckets`` ("L1,L2,...xB1,B2,..."); the default
    is PLA's, L in {8..256} and B in {1..64}, powers of two."""

    tokens: tuple[int, ...] = (8, 16, 32, 64, 128, 256)  # L: padded new tokens per request
    batch: tuple[int, ...] = (1, 2, 4, 8, 16, 32, 64)

    def __post_init__(self) -> None:
        for name, axis in (("tokens", self.tokens), ("batch", self.batch)):
            if not axis or any(v < 1 for v in axis) or list(axis) != sorted(set(axis)):
                raise ValueError(f"bucket grid {name} must be strictly ascending positive ints, got {axis}")

    @classmethod
    def parse(cls, text: str) -> BucketGrid:
        tokens_s, sep, batch_s = text.partition("x")
        if not sep:
            raise ValueError(f"--short-prefill-buckets must look like '64,128,256x1,2,4', got {text!r}")
        try:
            return cls(tuple(int(v) for v in tokens_s.split(",")), tuple(int(v) for v in batch_s.split(",")))
        except ValueError as exc:
            raise ValueError(f"--short-prefill-buckets {text!r}: {exc}") from None

    def __str__(self) -> str:
        return ",".join(map(str, self.tokens)) + "x" + ",".join(map(str, self.batch))

    @property
    def max_tokens(self) -> int:
        return self.tokens[-1]

    @property
    def max_batch(self) -> int:
        return self.batch[-1]

    def bucket(self, max_req_tokens: int, batch_size: int) -> tuple[int, int] | None:
        """Smallest (L, B) bucket holding ``batch_size`` requests of at most ``max_req_tokens``
        new tokens each, or None when the step exceeds the grid."""
        ti = bisect.bisect_left(self.tokens, max_req_tokens)
        bi = bisect.bisect_left(self.batch, batch_size)
        if ti == len(self.tokens) or bi == len(self.batch):
            return None
        return self.tokens[ti], self.batch[bi]


@dataclass(frozen=True)
class StepShape:
    batch_size: int
    num_tokens: int  # new tokens of all requests together
    bucket: tuple[int, int] | None = None  # padded (L per request, B) when the step fits the grid


@dataclass
class StepProfile:
    """What one engine step held and how long it took (seconds). Cost models learn from it,
    the simulator emits it, the busy figure sums ``total_s``."""

    mode: ForwardMode
    batch_size: int
    new_tokens: int  # tokens computed this step (prefill chunk tokens + one per decode)
    context_tokens: int  # KV tokens attended over, all requests (before this step's tokens)
    max_context_tokens: int  # longest request's context (Kairos keys its table by it)
    shape: StepShape
    total_s: float = 0.0  # schedule + batch building + forward + sampling + output hand-off
    forward_s: float = 0.0  # the model forward alone
    num_decode: int = 0  # decode requests inside the step (a mixed step has both kinds)
    attn_tokens2: int | None = None  # sum L_i (L_i + 2 H_i) over the step's requests (None: unknown)

    @property
    def overhead_s(self) -> float:
        return self.total_s - self.forward_s
