"""How long a step's forward took (StepProfile.forward_s, the input of the cost models).

On CPU the forward runs synchronously, so the host clock measures it. On a GPU the host returns
as soon as the kernels are queued: the host clock would measure launches (and a CUDA-graph
replay is one launch), so CUDA events recorded around the forward time it on the device. The
events are read after the step's results reached the host (sampling copies them back), so
reading them never waits for more than that copy already did.
"""

from __future__ import annotations

import time

import torch


class ForwardTimer:
    def __init__(self, device: torch.device | str) -> None:
        self._events: tuple[torch.cuda.Event, torch.cuda.Event] | None = None
        if torch.device(device).type == "cuda":
            self._events = (torch.cuda.Event(enable_timing=True),
                            torch.cuda.Event(enable_timing=True))
        self._t0 = 0.0
        self._recorded = False  # the events hold a forward not read yet
        self._last_s = 0.0

    def start(self) -> None:
        if self._events is not None:
            self._events[0].record()
        else:
            self._t0 = time.perf_counter()

    def stop(self) -> None:
        if self._events is not None:
            self._events[1].record()
            self._recorded = True
        else:
            self._last_s = time.perf_counter() - self._t0

    def seconds(self) -> float:
        """The last forward's duration (0.0 before any)."""
        if self._events is not None and self._recorded:
            start, end = self._events
            end.synchronize()
            self._last_s = start.elapsed_time(end) / 1e3  # milliseconds
            self._recorded = False
        return self._last_s
