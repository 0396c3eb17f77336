"""Debug log of the decode decisions (issue 34): one line per decode step, off by default.

Enabled by ``--log-level debug`` (the ``sglang_pd.engine.decode_log`` logger at DEBUG); when
disabled each call costs one ``isEnabledFor`` check. For a slack-guided decode policy a line
says what the policy saw and chose, and the step's predicted time beside the time it took:

  decode n=12 chose=6 ctx_max=380 gap=230.1ms t_all=151.2ms t_chosen=148.0ms behind=5
  due_ms(s=skipped)=[-31s,12,...] took=212.4ms

``ctx_max``: the longest chosen request's context (a padded attention backend's step costs
batch x that); ``t_all`` / ``t_chosen``: the table's step time with every running request /
with the batch chosen (the prediction for this step); ``took``: the step's ``total_s`` (what the table learns
from); ``gap``: time since the previous decode step started (a decoded request's inter-token
latency); ``due_ms``: each running request's time to its next deadline (negative: late), in
running order, ``s`` marking the skipped; ``behind``: how many are due before even a solo step
of theirs ends. Other decode policies log n, chosen, ctx_max, gap and took. The policy stays
pure: this reads its table and the requests from outside, after the decision.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

from sglang_pd.core.scheduled_step import ScheduledStep
from sglang_pd.core.step import ForwardMode, StepProfile
from sglang_pd.scheduling.decode.pacing import SlackDecodePolicy, decode_context
from sglang_pd.scheduling.types import DecodePolicy, SchedReq

logger = logging.getLogger("sglang_pd.engine.decode_log")
MAX_DUES = 32  # due times listed per line (the rest are summarised by the counts)


class DecodeLog:
    """Holds the last decision until its step's time is known (``decided`` then ``done``)."""

    def __init__(self) -> None:
        self._line: str | None = None
        self._last_start: float | None = None

    @staticmethod
    def enabled() -> bool:
        return logger.isEnabledFor(logging.DEBUG)

    def decided(self, policy: DecodePolicy, running: Sequence[SchedReq], step: ScheduledStep,
                now: float) -> None:
        if step.mode is not ForwardMode.DECODE or not self.enabled():
            self._line = None
            return
        gap = f"{1e3 * (now - self._last_start):.1f}ms" if self._last_start is not None else "-"
        self._last_start = now
        chosen = step.reqs
        longest = max((decode_context(r) for r in chosen), default=0)  # padded attention's cost
        head = f"decode n={len(running)} chose={len(chosen)} ctx_max={longest} gap={gap}"
        if not isinstance(policy, SlackDecodePolicy):
            self._line = head
            return
        model = policy.model
        ctx, dues, solo = policy.pace_view(running, now)  # the policy's own reading of the pace
        t_all = model.batch_s(ctx)
        t_chosen = model.batch_s([decode_context(r) for r in chosen])
        behind = sum(d < s for d, s in zip(dues, solo))
        ids = {id(r) for r in chosen}
        marks = ",".join(f"{1e3 * d:.0f}{'' if id(r) in ids else 's'}"
                         for d, r in list(zip(dues, running))[:MAX_DUES])
        self._line = (f"{head} t_all={1e3 * t_all:.1f}ms t_chosen={1e3 * t_chosen:.1f}ms "
                      f"behind={behind} due_ms(s=skipped)=[{marks}]")

    def done(self, profile: StepProfile | None) -> None:
        if self._line is None or profile is None:
            return
        logger.debug("%s took=%.1fms", self._line, 1e3 * profile.total_s)
        self._line = None
