"""Typed access to the disaggregation environment variables.

Names and defaults follow SGLang's (python/sglang/srt/environ.py) so existing
deployment scripts keep working:

  name (SGLANG_DISAGGREGATION_...)  type  default  meaning
  BOOTSTRAP_TIMEOUT                 int   300      prefill waits this long for decode's Register
  WAITING_TIMEOUT                   int   300      decode waits this long for KV after bootstrap
  HEARTBEAT_INTERVAL                float 5.0      decode -> prefill bootstrap ping period (s)
  HEARTBEAT_MAX_FAILURE             int   2        missed pings in a row before prefill is dead
  NIXL_BACKEND                      str   UCX      NIXL backend plugin

Values are read once into a frozen ``DisaggEnvs`` snapshot; code under test
passes its own snapshot instead of mutating os.environ.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Generic, TypeVar

T = TypeVar("T")


@dataclass(frozen=True)
class EnvVar(Generic[T]):
    name: str
    default: T
    parse: Callable[[str], T]
    minimum: float | None = None  # inclusive lower bound, for numeric vars

    def get(self, environ: Mapping[str, str] | None = None) -> T:
        env = os.environ if environ is None else environ
        raw = env.get(self.name)
        if raw is None or raw.strip() == "":
            return self.default
        try:
            value = self.parse(raw.strip())
        except ValueError:
            kind = getattr(self.parse, "__name__", "value")
            raise ValueError(
                f"environment variable {self.name}={raw!r} is not a valid {kind} "
                f"(default {self.default!r})"
            ) from None
        if self.minimum is not None and value < self.minimum:  # type: ignore[operator]
            raise ValueError(
                f"environment variable {self.name}={raw!r} must be >= {self.minimum} "
                f"(default {self.default!r})"
            )
        return value


BOOTSTRAP_TIMEOUT = EnvVar("SGLANG_DISAGGREGATION_BOOTSTRAP_TIMEOUT", 300, int, minimum=1)
WAITING_TIMEOUT = EnvVar("SGLANG_DISAGGREGATION_WAITING_TIMEOUT", 300, int, minimum=1)
HEARTBEAT_INTERVAL = EnvVar("SGLANG_DISAGGREGATION_HEARTBEAT_INTERVAL", 5.0, float, minimum=0.01)
HEARTBEAT_MAX_FAILURE = EnvVar("SGLANG_DISAGGREGATION_HEARTBEAT_MAX_FAILURE", 2, int, minimum=1)
NIXL_BACKEND = EnvVar("SGLANG_DISAGGREGATION_NIXL_BACKEND", "UCX", str)


@dataclass(frozen=True)
class DisaggEnvs:
    bootstrap_timeout: float = 300.0
    waiting_timeout: float = 300.0
    heartbeat_interval: float = 5.0
    heartbeat_max_failure: int = 2
    nixl_backend: str = "UCX"

    @property
    def silence_limit(self) -> float:
        """G: a peer silent this long is dead (one heartbeat period more than decode allows)."""
        return self.heartbeat_interval * (self.heartbeat_max_failure + 1)

    @property
    def quarantine_limit(self) -> float:
        """Last-resort bound on decode's page quarantine after a failure it noticed itself.

        A live prefill that got decode's Abort ends every write into the room within
        WAITING_TIMEOUT (a stuck WRITE is cancelled then), and gives up on a WRITE that NIXL
        could not cancel after another WAITING_TIMEOUT; G covers detection and delivery. Decode
        normally frees far sooner: on the AbortAck, or when the prefill's heartbeats stop.
        Defaults: 2 * 300 + 15 = 615 s."""
        return 2 * self.waiting_timeout + self.silence_limit

    @classmethod
    def load(cls, environ: Mapping[str, str] | None = None) -> DisaggEnvs:
        return cls(
            bootstrap_timeout=float(BOOTSTRAP_TIMEOUT.get(environ)),
            waiting_timeout=float(WAITING_TIMEOUT.get(environ)),
            heartbeat_interval=HEARTBEAT_INTERVAL.get(environ),
            heartbeat_max_failure=HEARTBEAT_MAX_FAILURE.get(environ),
            nixl_backend=NIXL_BACKEND.get(environ),
        )
