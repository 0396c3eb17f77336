"""The PD admission rules, torch-free: one definition for the engine's PD sides (engine/pd.py)
and the simulator (sim/instance.py), so both admit, hold and free KV pages the same way.

Prefill (``--mode prefill``): a request becomes schedulable (joins the scheduler's waiting
queue, where the prefill policy sees it) only once its decode has reserved its destination pages
(the bootstrap Register); until then it waits outside the queues without pages, its deadline
still counting from its arrival. A prompt's pages are allocated whole at its first chunk (decode
registers a fixed destination page list for the whole prompt), and the request is parked with
its pages after its first token until the KV transfer ends (then its pages are freed).

Why prefill waits for decode: decode reserves pages in arrival order (below), while a priority
prefill policy (kairos, edf, lars, dual queues) runs requests in its own order. Were a request
schedulable on arrival, prefill could fill its memory with finished prompts (parked, pages held,
waiting for a decode destination) while decode's pages sat reserved for prompts prefill had not
started: each side holding what the other needs, until the transfer timeouts (300 s) broke it.
With the rule, everything prefill computes has a destination, so its pages always drain. (SGLang's
prefill does the same with its bootstrap queue; routers see no difference.) Requests computed
locally (health checks: nothing to transfer) are schedulable at once.

Decode (``--mode decode``): requests wait parked, without pages, in FIFO order; the head gets
its prompt's pages when fewer than ``max_running`` requests are running or have KV arriving and
the pool keeps ``--num-reserved-decode-tokens`` of headroom for the running ones to decode into
(with nothing else running it is admitted without headroom). Nothing overtakes the head.
"""

from __future__ import annotations


def whole_prompt_pages(role: str) -> bool:
    """Does a server of this role allocate a prompt's pages whole at its first chunk?"""
    return role == "prefill"


def prefill_schedulable(decode_reserved: bool, runs_locally: bool = False) -> bool:
    """May a request on a prefill server enter its scheduler's waiting queue now? Only once its
    decode has reserved (registered) its destination pages, unless nothing will be sent."""
    return runs_locally or decode_reserved


def pages_for(tokens: int, page_size: int) -> int:
    return -(-tokens // page_size)


def decode_admits(num_running: int, num_transferring: int, max_running: int, need_pages: int,
                  reserved_pages: int, num_free: int) -> bool:
    """May the decode pre-allocation queue's head take ``need_pages`` pages now? False: it and
    every request behind it keep waiting."""
    if num_running + num_transferring >= max_running:
        return False  # --max-running-requests counts requests whose KV is arriving too
    if need_pages + reserved_pages > num_free and (num_running or num_transferring):
        return False  # wait for memory; with nothing else running, admit without headroom
    return need_pages <= num_free
