"""The setups ``scripts/bench_cluster.py`` compares (issue 34 item 2): each a router and the flags
of every prefill and decode server, named after what it imitates. One table, read by
bench_cluster and by ``sim_fidelity_cluster.py`` (which maps our setups onto the simulator).

``prefills``: how many prefill servers each setup runs (2, the issue's cluster, or 1). With one,
every setup has a single prefill of its own policy: ours keeps its dual queues and kairos+ on an
instance of role ``both`` (no length pools to split), and the ablations that move work between
pools (``ours-no-pools``, ``+controller``, ``+spill``) become ``ours`` again, so they are left out.
"""

from __future__ import annotations

from dataclasses import dataclass

OURS_PREFILL = ("--prefill-policy", "kairos+", "--prefill-queues", "dual")
# SGLang's prefill answers a finished prompt only between its forwards (its inflight queue is
# polled between batches), and SGLang's router holds the client's first token until that answer
# (sgl-project/sglang#22853): the baselines' prefills do the same. "+handoff" rows: as if it
# answered at once (our prefill's default, --disaggregation-prefill-handoff-wait-ms 50).
AS_SGLANG_PREFILL = ("--disaggregation-prefill-handoff-wait-ms", "0")
# ours+budget: Medha's adaptive chunking as a preemption quantum on the prefill servers (a long
# prompt's chunks sized to end within it, so a short waits behind at most one such chunk); off in
# `ours`, as the servers' default. A long prompt with slack yields up to 40% of it (chunking.py,
# rho <= 0.4), so its chunks take ~0.6 x 700 = 420 ms here: a short then waits at most that,
# inside the 1 s short SLO beside its own ~200-300 ms batch on this CPU. 400 ms was tried first:
# as good for shorts, but twice the chunks, each paying the step's fixed cost, and a long prompt
# missed its SLO in one of two rounds (docs/bench_cluster.md, session 13).
TIME_BUDGET_MS = 700.0
POOL_SETUPS = ("ours-no-pools", "ours+controller", "ours+spill")  # the same as ours with one prefill


@dataclass(frozen=True)
class Setup:
    name: str
    router: str  # "sglang" | "ours"
    prefill: tuple[tuple[str, ...], ...]  # flags of each prefill server
    decode: tuple[str, ...]
    router_flags: tuple[str, ...] = ()
    what: str = ""


def cluster_setups(edf_concurrency: int, prefills: int = 2,
                   time_budget_ms: float = TIME_BUDGET_MS) -> dict[str, Setup]:
    """Every setup by name, in the order bench_cluster runs them by default (``time_budget_ms``:
    ``ours+budget``'s ``--prefill-time-budget-ms``)."""
    if prefills not in (1, 2):
        raise ValueError(f"prefills must be 1 or 2, not {prefills}")

    def each(flags: tuple[str, ...]) -> tuple[tuple[str, ...], ...]:
        return (flags,) * prefills

    fcfs = each(("--prefill-policy", "fcfs"))
    spf = ("--prefill-policy", "sglang-spf")
    continuous = ("--decode-policy", "continuous")
    our_roles = ("short", "long") if prefills == 2 else ("both",)

    def ours(name: str, what: str, prefill: tuple[str, ...] = OURS_PREFILL,
             roles: tuple[str, ...] = our_roles, decode: str = "slack+", controller: str = "off",
             route: str = "length_aware", extra: tuple[str, ...] = (),
             decode_extra: tuple[str, ...] = ()) -> Setup:
        return Setup(name, "ours", tuple((*prefill, "--prefill-role", r) for r in roles),
                     ("--decode-policy", decode, *decode_extra),
                     ("--pool-controller", controller, "--prefill-policy", route, *extra), what)

    rows = [
        Setup("sglang-pd", "sglang", each(("--prefill-policy", "fcfs", *AS_SGLANG_PREFILL)), continuous, (),
              "SGLang's router, fcfs prefill, continuous decode"),
        Setup("sglang-pd+handoff", "sglang", fcfs, continuous, (),
              "sglang-pd, its prefills answering a finished prompt at once"),
        Setup("sglang-spf", "sglang", each((*spf, *AS_SGLANG_PREFILL)), continuous, (),
              "SGLang's router, shortest-prefill-first"),
        Setup("sglang-spf+handoff", "sglang", each(spf), continuous, (),
              "sglang-spf, its prefills answering at once"),
        Setup("vllm-threshold", "sglang", each(("--prefill-policy", "vllm-threshold", *AS_SGLANG_PREFILL)),
              continuous, (), "SGLang's router, vLLM's long-prefill cap"),
        Setup("dynamo-edf", "ours", fcfs, continuous,
              ("--prefill-policy", "power_of_two", "--pool-controller", "off", "--queue-order", "edf",
               "--max-concurrent-requests", str(edf_concurrency), "--queue-timeout-secs", "300"),
              f"our router, EDF queue over {edf_concurrency} in flight, fcfs/continuous"),
        ours("ours", "length pools, dual queues + kairos+, slack+" if prefills == 2
             else "one prefill: dual queues + kairos+, slack+"),
        ours("ours-no-pools", "ours, both prefills of role both", roles=("both",) * prefills),
        ours("ours-no-dual", "ours, single queues (kairos+)", prefill=("--prefill-policy", "kairos+")),
        ours("ours-no-kairos", "ours, dual queues over fcfs",
             prefill=("--prefill-policy", "fcfs", "--prefill-queues", "dual")),
        ours("ours-no-slack", "ours, continuous decode", decode="continuous"),
        ours("ours+reserve", "ours, slack+ keeping the decode table's p90 overrun in reserve",
             decode_extra=("--decode-reserve-quantile", "0.9")),
        ours("ours+budget", f"ours, long chunks sized to end within {time_budget_ms:g} ms (Medha's adaptive chunking)",
             prefill=(*OURS_PREFILL, "--prefill-time-budget-ms", f"{time_budget_ms:g}")),
        ours("ours+controller", "ours, pool controller on", controller="on"),
        ours("ours+spill", "ours, longs spill onto an idle short instance (item 0)", route="length_aware_spill"),
        ours("ours+cond", "ours, shorts prefilled on decode while their prefill is loaded (item 3)",
             extra=("--conditional-disagg", "on")),
    ]
    return {s.name: s for s in rows if prefills == 2 or s.name not in POOL_SETUPS}
