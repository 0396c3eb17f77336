"""Building an engine from ``ServerArgs``: model, attention backend, graph memory, KV pool,
page allocator, model runner, scheduler with its policies, stop checker, and the PD side.

``EngineCore`` only runs what this returns; the order here matters (the backend decides
whether graphs are used, graph memory is kept out of the pool before the pool is sized, and
the warm-up runs before the first request).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, replace

import torch

from sglang_pd.core.page_allocator import Allocator, PageAllocator
from sglang_pd.core.pd_rules import whole_prompt_pages
from sglang_pd.core.scheduler import Scheduler
from sglang_pd.engine.admission import Limits
from sglang_pd.engine.attention import create_attention_backend
from sglang_pd.engine.cpu_tuning import tune_allocator, tune_threads
from sglang_pd.engine.cuda_graph import graph_max_bs, graph_reserve_bytes
from sglang_pd.engine.kv_pool import KVPool
from sglang_pd.engine.memory import pool_pages
from sglang_pd.engine.model_runner import ModelRunner
from sglang_pd.engine.pd import PDHooks, create_pd_hooks
from sglang_pd.engine.prefill_graph import prefill_graph_reserve_bytes, short_prefill_graph_grid
from sglang_pd.engine.stop import StopChecker
from sglang_pd.engine.warmup import warm_up
from sglang_pd.models.config import ModelConfig
from sglang_pd.models.loader import load_model
from sglang_pd.models.parallel import TPGroup, local_kv_heads
from sglang_pd.protocol import EngineReady
from sglang_pd.scheduling.config import PolicyConfig
from sglang_pd.scheduling.registry import create_decode_policy, create_prefill_policy
from sglang_pd.server_args import ServerArgs

logger = logging.getLogger(__name__)


def cpu_aware_dtype(name: str, device: str) -> str:
    """"auto" means float32 on CPU (half-precision matmuls are slow and lossy there); elsewhere
    the loader resolves "auto" to the checkpoint's dtype, as SGLang does."""
    return "float32" if name == "auto" and device == "cpu" else name


@dataclass
class EngineParts:
    """Everything an ``EngineCore`` runs, built once from ``ServerArgs``."""

    model: torch.nn.Module
    config: ModelConfig
    context_length: int
    kv_pool: KVPool
    allocator: Allocator  # the scheduler's view: with a prefix cache, evictable pages count as free
    max_total_num_tokens: int
    runner: ModelRunner
    policy_config: PolicyConfig
    scheduler: Scheduler
    stop_checker: StopChecker
    pd: PDHooks


    @property
    def limits(self) -> Limits:
        return Limits(self.context_length, self.max_total_num_tokens, self.config.vocab_size,
                      self.stop_checker.tokenizer is not None)

    def ready_info(self, args: ServerArgs) -> EngineReady:
        """What the frontend learns of the engine once it is up."""
        return EngineReady(
            ok=True, model_path=args.model_path, served_model_name=args.model_name,
            architecture=self.config.architecture, context_length=self.context_length,
            vocab_size=self.config.vocab_size, eos_token_ids=list(self.config.eos_token_ids),
            max_total_num_tokens=self.max_total_num_tokens,
            max_running_requests=args.max_running_requests, page_size=args.page_size,
            num_pages=self.kv_pool.num_pages, disaggregation_mode=args.disaggregation_mode,
        )


def build_engine(args: ServerArgs, tp: TPGroup | None = None) -> EngineParts:
    if args.device == "cpu":
        tune_allocator()
        if tp is None or tp.size == 1:  # TP ranks split the cores (engine/tp/group.py)
            tune_threads()  # one worker per core stalls every operator when a core is busy
    torch.manual_seed(args.random_seed)
    model, cfg = load_model(args.model_path, cpu_aware_dtype(args.dtype, args.device), args.device,
                            args.load_format, tp)
    kv_heads = local_kv_heads(cfg, tp or TPGroup.single())  # this rank's KV heads (engine/tp/)
    dtype = next(model.parameters()).dtype
    context_length = args.context_length or cfg.max_position_embeddings
    # the backend first: graphs (and the memory kept for them) only with one that supports them
    attention = create_attention_backend(args.attention_backend, args.device,
                                         cuda_graph=not args.disable_cuda_graph)
    graph_bs = graph_max_bs(args.device, args.disable_cuda_graph, args.cuda_graph_max_bs, attention)
    graph_reserve = graph_reserve_bytes(graph_bs, cfg, dtype) if graph_bs else 0
    # short-prefill graphs where a short queue feeds the engine (engine/prefill_graph.py)
    prefill_grid = short_prefill_graph_grid(args, graph_bs > 0 and attention.supports_prefill_graph)
    if prefill_grid is not None:
        graph_reserve += prefill_graph_reserve_bytes(prefill_grid, cfg, dtype)
    num_pages = pool_pages(
        max_total_tokens=args.max_total_tokens, mem_fraction_static=args.mem_fraction_static,
        device=args.device, page_size=args.page_size,
        # this rank's KV heads only, PD or not (PD with TP writes rank to rank: tp/rank_kv.py)
        bytes_per_token=KVPool.bytes_per_token(cfg.num_layers, kv_heads,
                                               cfg.head_dim, dtype),
        reserved_bytes=graph_reserve,  # graphs are captured after the pool: kept out before it
    )
    kv_pool = KVPool(cfg.num_layers, num_pages, args.page_size, kv_heads, cfg.head_dim,
                     dtype, args.device)
    allocator = PageAllocator(num_pages)
    max_total_num_tokens = allocator.num_usable * args.page_size
    runner = ModelRunner(model, kv_pool, attention, cuda_graph_max_bs=graph_bs,
                         max_positions=cfg.max_position_embeddings,
                         graph_reserved_bytes=graph_reserve, prefill_graph_grid=prefill_grid)
    # compile every kernel variant now, not in a request (not with TP: warm-up forwards bypass
    # the plan the other ranks follow)
    if args.device.startswith("cuda") and tp is None:
        warm_up(runner, min(context_length, cfg.max_position_embeddings, max_total_num_tokens))
    cfg_p = replace(args.policy_config(), decode_attention_padded=attention.decode_pads_to_longest)
    scheduler = Scheduler(
        allocator, cfg_p, create_prefill_policy(args.schedule_policy, cfg_p),
        create_decode_policy(args.decode_policy, cfg_p),
        whole_prompt_pages=whole_prompt_pages(args.disaggregation_mode),  # core/pd_rules.py
        # prefix cache (core/prefix_hits.py); on decode only when asked: there it saves transfer,
        # not compute (disaggregation/decode_reuse.py)
        prefix_cache=not args.disable_radix_cache and (
            args.disaggregation_mode != "decode" or args.disaggregation_decode_enable_radix_cache),
    )
    stop_checker = StopChecker(None if args.skip_tokenizer_init else args.tokenizer_dir,
                               list(cfg.eos_token_ids), context_length)
    pd = create_pd_hooks(args.disaggregation_mode, scheduler, args.page_size, kv_pool.kv_buffer,
                         args.host, args.disaggregation_bootstrap_port,
                         args.num_reserved_decode_tokens, args.max_running_requests, runner,
                         tp.size if tp is not None else 1, cfg.num_kv_heads)
    logger.info("engine ready: %s, %d KV pages x %d tokens, dtype %s", cfg.architecture,
                num_pages - 1, args.page_size, dtype)
    return EngineParts(model, cfg, context_length, kv_pool, scheduler.allocator, max_total_num_tokens, runner,
                       cfg_p, scheduler, stop_checker, pd)
