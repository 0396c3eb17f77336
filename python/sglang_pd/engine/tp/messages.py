"""The typed messages between rank 0 and the other tensor-parallel ranks (msgpack; never pickle).

rank 0 -> rank r (PUSH/PULL, one socket per rank, in order): TPInit once, then a StepPlan per
forward (in PD mode also the KV messages between forwards: KVPeers / KVWrite / KVCancel /
KVDropPeer / KVSettle, rank_kv.py), then TPShutdown. Every rank gets every message; a KV message names the rank(s) it concerns.
rank r -> rank 0 (one PULL for all): TPReady at each start-up stage, then (per-rank PD) a
KVWriteDone per KVWrite it had writes in, and a KVSettled per KVSettle.
"""

from __future__ import annotations

import os

import msgspec

from sglang_pd.disaggregation.messages import RankAgent
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


class SliceWrite(msgspec.Struct):
    """One NIXL WRITE of heads [src_lo, src_lo + width) of ``src_pages`` in prefill rank
    ``src_rank``'s pool to heads [dst_lo, ...) of ``dst_pages`` in agent ``peer``'s pool."""

    src_rank: int
    peer: str  # the decode rank's agent name (loaded by KVPeers)
    src_pages: list[int]
    dst_pages: list[int]
    src_lo: int
    dst_lo: int
    width: int
    whole: bool  # both pools hold exactly these heads: whole-page descriptors
    notif: bytes


class KVPeers(msgspec.Struct, tag="kv_peers"):
    """PD prefill, per-rank: load these decode ranks' agents (a decode's first Register)."""

    agents: list[RankAgent]


class KVDropPeer(msgspec.Struct, tag="kv_drop_peer"):
    agent_names: list[str]


class KVWrite(msgspec.Struct, tag="kv_write"):
    """Post your slices of transfer ``xfer`` (those with src_rank == your rank)."""

    xfer: int
    writes: list[SliceWrite]


class KVCancel(msgspec.Struct, tag="kv_cancel"):
    xfer: int


class KVSettle(msgspec.Struct, tag="kv_settle"):
    """PD decode, per-rank: answer KVSettled once your agent has had ``counts[rank]`` partial
    notifications for ``room`` (tp_slices.py)."""

    room: int
    counts: list[int]


class KVWriteDone(msgspec.Struct, tag="kv_write_done"):
    """Every write of ``xfer`` on ``rank`` has ended (ok: all landed)."""

    rank: int
    xfer: int
    ok: bool
    error: str = ""


class KVSettled(msgspec.Struct, tag="kv_settled"):
    rank: int
    room: int
    ok: bool
    error: str = ""


class TPShutdown(msgspec.Struct, tag="shutdown"):
    reason: str = ""


class TPReady(msgspec.Struct, tag="ready"):
    rank: int
    stage: str  # "joined": process up, about to join the group; "ready": model and pool built
    ok: bool = True
    error: str = ""
    kv_agent: RankAgent | None = None  # per-rank PD, with "ready": this rank's NIXL agent


ToRank = TPInit | StepPlan | KVPeers | KVDropPeer | KVWrite | KVCancel | KVSettle | TPShutdown
FromRank = TPReady | KVWriteDone | KVSettled

_to_rank = msgspec.msgpack.Decoder(ToRank)
_from_rank = msgspec.msgpack.Decoder(FromRank)


def decode_to_rank(data: bytes) -> ToRank:
    return _to_rank.decode(data)


def decode_from_rank(data: bytes) -> FromRank:
    return _from_rank.decode(data)


def plan_addr(ipc_dir: str, rank: int) -> str:
    """Where rank ``rank`` pulls its plans from (rank 0 binds)."""
    return f"ipc://{os.path.join(ipc_dir, f'tp_plan_{rank}')}"


def ready_addr(ipc_dir: str) -> str:
    """Where rank 0 pulls every rank's start-up reports from."""
    return f"ipc://{os.path.join(ipc_dir, 'tp_ready')}"
