"""The one request class (router/sglang_pd_router/request_class.py): threshold, roles, classify,
the router's class headers and how a server resolves them; the server's load signals use it."""

from __future__ import annotations

from policy_helpers import FakeReq
from sglang_pd.core.load_signals import LoadTracker, class_queues
from sglang_pd.scheduling.config import DEFAULT_SHORT_PREFILL_THRESHOLD, PREFILL_ROLES
from sglang_pd_router import request_class as rc
from sglang_pd_router.policies import PREFILL_ROLES as ROUTER_ROLES


def test_one_classify_for_router_server_and_sim() -> None:
    """request_class.py is the one definition: the server's load signals classify by it and
    take the class a request came with (the router's, checked by the frontend) first."""
    assert DEFAULT_SHORT_PREFILL_THRESHOLD == rc.SHORT_PREFILL_THRESHOLD == 256
    assert PREFILL_ROLES is rc.PREFILL_ROLES is ROUTER_ROLES
    assert rc.classify(256) == "short" and rc.classify(257) == "long"
    assert rc.resolve_class(rc.SentClass("long", 10), 10, 256) == ("long", False)
    assert rc.resolve_class(rc.SentClass("long", 11), 10, 256) == ("short", True)
    assert rc.read_class_headers(rc.class_headers("short", 7)) == rc.SentClass("short", 7)
    assert rc.read_class_headers({rc.CLASS_HEADER: "short", rc.CLASS_TOKENS_HEADER: "-1"}) is None
    loads = LoadTracker()
    req = FakeReq("r", 0.0, 10, slo_ttft_s=1.0)  # 10 new tokens: short by the threshold
    loads.first_token(req, 2.0, 256)
    loads.first_token(req, 3.0, 256, "long")  # the class it came with wins
    assert list(loads.deviation["short"]) == [1.0] and list(loads.deviation["long"]) == [2.0]
    assert class_queues([req], 5)["num_queue_reqs_long"] == 1
