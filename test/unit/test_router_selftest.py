"""The operator's self-test (``python -m sglang_pd_router.selftest URL``) passes against a
hardened router with keys; its table names every case."""

from __future__ import annotations

import pytest

from router_helpers import router_cluster
from sglang_pd_router.selftest import SelfTest, print_table

pytestmark = pytest.mark.timeout(120)


async def test_selftest_passes_against_the_router(capsys) -> None:
    async with router_cluster(api_key="k", admin_api_key="adm", client_idle_timeout_s=0.5,
                              body_timeout_s=0.5) as c:
        c.service.registry.by_kind["decode"][0].context_length = 4096
        cases = await SelfTest(c.url, "k", "adm", 0.5, 0.5).run()
    print_table(cases)
    table = capsys.readouterr().out
    failed = [(x.name, x.got) for x in cases if not x.passed and x.name != "health-under-load"]
    assert failed == [], table
    names = {x.name for x in cases}
    assert {"ids-int", "deep-json", "bad-gzip", "huge-declared", "slow-headers", "slow-body",
            "self", "no-key", "metrics-no-key"} <= names
    assert "passed" in table
