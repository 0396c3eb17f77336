"""The typed messages between rank 0 and the other tensor-parallel ranks (msgpack; never pickle).

rank 0 -> rank r (PUSH/PULL, one socket per rank, in order): TPInit once, then a StepPlan per
forward (in PD mode also KVGather / KVScatter between forwards), then TPShutdown.
rank r -> rank 0 (one PULL for all): TPReady at each start-up stage.
"""

from __future__ import annotations

import os

import msgspec

from sglang_pd.protocol import encode as encode  # the one msgpack encoder, re-exported for the ranks


class TPInit(msgspec.Struct, tag="init"):
    num_pages: int  # rank 0's KV pool size: every rank holds the same pages (its KV heads)


class StepPlan(msgspec.Struct, tag="step"):
    """Everything a rank needs to run rank 0's forward: the ForwardBatch's host lists. No token
    is ever sampled on ranks > 0: rank 0 samples, and the token reaches the others as the next
    plan's ``input_ids``, so every rank computes on the same token by construction."""

    mode: str  # ForwardMode value
    input_ids: list[int]
    positions: list[int]
    out_loc: list[int]
    seq_lens: list[int]
    extend_lens: list[int]
    pages: list[list[int]]  # each request's KV pages (same page numbers on every rank)


class KVGather(msgspec.Struct, tag="kv_gather"):
    """PD prefill with TP: send rank 0 your KV heads of ``pages`` (a gather collective right
    after this message, in plan order; engine/tp/kv_move.py)."""

    pages: list[int]


class KVScatter(msgspec.Struct, tag="kv_scatter"):
    """PD decode with TP: take your KV heads of ``pages`` from rank 0 (a scatter collective)."""

    pages: list[int]


class TPShutdown(msgspec.Struct, tag="shutdown"):
    reason: str = ""


class TPReady(msgspec.Struct, tag="ready"):
    rank: int
    stage: str  # "joined": process up, about to join the group; "ready": model and pool built
    ok: bool = True
    error: str = ""


ToRank = TPInit | StepPlan | KVGather | KVScatter | TPShutdown

_to_rank = msgspec.msgpack.Decoder(ToRank)
_ready = msgspec.msgpack.Decoder(TPReady)


def decode_to_rank(data: bytes) -> ToRank:
    return _to_rank.decode(data)


def decode_ready(data: bytes) -> TPReady:
    return _ready.decode(data)


def plan_addr(ipc_dir: str, rank: int) -> str:
    """Where rank ``rank`` pulls its plans from (rank 0 binds)."""
    return f"ipc://{os.path.join(ipc_dir, f'tp_plan_{rank}')}"


def ready_addr(ipc_dir: str) -> str:
    """Where rank 0 pulls every rank's start-up reports from."""
    return f"ipc://{os.path.join(ipc_dir, 'tp_ready')}"
