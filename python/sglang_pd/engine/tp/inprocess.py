"""EngineCore with its tensor-parallel ranks, driven in the calling process (rank 0 is the
caller): the parity tests and the overhead bench use it; the server's engine process does the
same steps with its own error reporting (engine_process.py)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from sglang_pd.engine.engine_core import EngineCore
from sglang_pd.engine.tp.launcher import TPRanks, tp_server_args
from sglang_pd.server_args import ServerArgs


@contextmanager
def engine_core(args: ServerArgs) -> Iterator[tuple[EngineCore, TPRanks | None]]:
    """(core, ranks); ranks is None with --tp-size 1. The ranks stop on the way out."""
    args = tp_server_args(args)
    ranks = TPRanks.start(args) if args.tp_size > 1 else None
    try:
        core = EngineCore(args, tp=ranks.group if ranks else None)
        if ranks is not None:
            ranks.attach(core.runner, core.kv_pool.num_pages)
        try:
            yield core, ranks
        finally:
            core.close()
    finally:
        if ranks is not None:
            ranks.close()
