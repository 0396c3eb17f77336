"""One line per finished request with where its time went on this engine (issue 34).

A PD request's TTFT is spent on three machines' worth of stages: the prefill's queue and
forward, the KV transfer, the decode's admission. The client sees only the sum; this line
splits it per engine, and ``scripts/request_timeline_report.py`` joins a prefill's line with
its decode's by bootstrap room (both engines log the same room):

  request rid=ab12 room=8841 mode=prefill class=short prompt=52 cached=0 out=1
  arrival=1764316801.2345 queue_ms=212.4 first_ms=398.0 end_ms=402.7 status=ok

``arrival``: wall time (``time.time()``) of the frontend's arrival, so lines of different
processes line up; ``queue_ms``: arrival to the first step that ran the request here (its
first prefill chunk; on a PD decode server its first decode step); ``first_ms``: arrival to
its first token here (prefill: the forward that sampled it; PD decode: its KV and first
token arrived); ``end_ms``: arrival to the finish (prefill: its transfer done). ``-`` for a
stage the request never reached. Logged at INFO with ``--log-requests`` (SGLang's flag),
else at DEBUG; when neither is enabled each call costs one ``isEnabledFor`` check.
"""

from __future__ import annotations

import logging
import time

from sglang_pd.engine.request import Req

logger = logging.getLogger("sglang_pd.engine.request_log")


def _since(t: float | None, arrival: float) -> str:
    return "-" if t is None else f"{1e3 * (t - arrival):.1f}"


class RequestLog:
    def __init__(self, mode: str, log_requests: bool) -> None:
        self.mode = mode
        self.level = logging.INFO if log_requests else logging.DEBUG

    def enabled(self) -> bool:
        return logger.isEnabledFor(self.level)

    def finished(self, req: Req, now: float, status: int) -> None:
        """``now``: the engine clock at the finish (``req.arrival`` is on the same clock)."""
        if not self.enabled():
            return
        arrival_wall = time.time() - (now - req.arrival)
        room = req.bootstrap_room if req.bootstrap_room >= 0 else "-"
        logger.log(self.level,
                   "request rid=%s room=%s mode=%s class=%s prompt=%d cached=%d out=%d "
                   "arrival=%.4f queue_ms=%s first_ms=%s end_ms=%.1f status=%s",
                   req.rid, room, self.mode, req.request_class or "-", req.prompt_len,
                   req.cached_len, len(req.output_ids), arrival_wall,
                   _since(req.first_run_time, req.arrival), _since(req.first_token_time, req.arrival),
                   1e3 * (now - req.arrival), status or "ok")
