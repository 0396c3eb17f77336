"""A deterministic stand-in for the engine process, plus a throwaway model directory.

Same entry signature as ``sglang_pd.engine.engine_process.run_engine_process``; select it
with ``SGLANG_PD_ENGINE_ENTRY=fake_engine:run_engine_process`` (this directory on
PYTHONPATH). Behaviour:
  * token i+1 = (token i + 1) % vocab_size, starting from the last prompt token; one token
    per running request every FAKE_ENGINE_STEP_S seconds (default 0.005);
  * honours max_new_tokens, min_new_tokens, stop_token_ids, eos (unless ignore_eos), stop
    strings (decoded with the model's tokenizer), aborts (counted), logprobs (fake values);
  * a request whose rid starts with "fake-reject" is rejected with error_status 400;
  * ControlReq: get_load (includes num_aborted / num_received), flush_cache, server_info
    (includes pid), shutdown;
  * FAKE_ENGINE_FAIL=<message> makes start-up fail with EngineReady(ok=False).
  * FAKE_ENGINE_STALL_S=<s> reports that queued work made no progress for s seconds.
  * FAKE_ENGINE_IGNORE_CONTROL=<m1,m2> leaves those ControlReq methods unanswered.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import signal
import time
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from typing import Any

import zmq

from sglang_pd.protocol import (AbortReq, BatchOut, ControlReq, ControlResp, EngineReady,
                                EngineStats, FlushCache, GenerateReq, GetLoad, ReqOutput, ServerInfo,
                                Shutdown, TokenLogprob, decode_to_engine, encode)
from sglang_pd.server_args import ServerArgs

CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
_CORPUS = [
    "The quick brown fox jumps over the lazy dog. Hello world, hello there!",
    "Serving large language models with prefill and decode on separate machines.",
    "Ünïcödé têxt: naïve café, 世界 你好, こんにちは, 🙂 🚀 emoji and ∑ math ≠ ascii.",
    "def main():\n    print('hi')\n    return 0\n",
]


def write_tiny_model_dir(path: str, vocab_size: int = 400, context_length: int = 256) -> str:
    """tokenizer.json (byte-level BPE), tokenizer_config.json (ChatML), config.json."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    os.makedirs(path, exist_ok=True)
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=SPECIAL_TOKENS,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    tok.train_from_iterator(_CORPUS * 20, trainer)
    tok.save(os.path.join(path, "tokenizer.json"))
    config = {"eos_token": "<|im_end|>", "pad_token": "<|endoftext|>", "bos_token": None,
              "chat_template": CHATML_TEMPLATE, "model_max_length": context_length}
    with open(os.path.join(path, "tokenizer_config.json"), "w") as f:
        json.dump(config, f)
    model_config = {"architectures": ["FakeForCausalLM"], "model_type": "fake",
                    "vocab_size": tok.get_vocab_size(with_added_tokens=True),
                    "max_position_embeddings": context_length,
                    "eos_token_id": SPECIAL_TOKENS.index("<|im_end|>")}
    with open(os.path.join(path, "config.json"), "w") as f:
        json.dump(model_config, f)
    return path


@dataclass
class _Running:
    req: GenerateReq
    last: int
    generated: list[int] = field(default_factory=list)


@dataclass
class FakeEngine:
    server_args: ServerArgs
    vocab_size: int
    eos_ids: list[int]
    tokenizer: Any
    push: zmq.Socket
    running: dict[str, _Running] = field(default_factory=dict)
    num_aborted: int = 0
    num_received: int = 0
    stop: bool = False

    def send(self, outputs: list[ReqOutput], stats: EngineStats | None = None) -> None:
        self.push.send(encode(BatchOut(outputs=outputs, stats=stats)))

    def handle(self, msg: GenerateReq | AbortReq | ControlReq) -> None:
        if isinstance(msg, GenerateReq):
            self.num_received += 1
            if msg.rid.startswith("fake-reject"):
                self.send([ReqOutput(rid=msg.rid, new_token_ids=[],
                                     prompt_tokens=len(msg.input_ids), completion_tokens=0,
                                     finish_reason={"type": "abort",
                                                    "message": "rejected by the fake engine"},
                                     error_status=400)])
                return
            self.running[msg.rid] = _Running(msg, msg.input_ids[-1])
        elif isinstance(msg, AbortReq):
            rids = list(self.running) if msg.rid == "" else [msg.rid]
            outs = []
            for rid in rids:
                run = self.running.pop(rid, None)
                if run is not None:
                    self.num_aborted += 1
                    outs.append(ReqOutput(rid=rid, new_token_ids=[],
                                          prompt_tokens=len(run.req.input_ids),
                                          completion_tokens=len(run.generated),
                                          finish_reason={"type": "abort",
                                                         "message": "aborted"}))
            if outs:
                self.send(outs)
        elif msg.method not in os.environ.get("FAKE_ENGINE_IGNORE_CONTROL", "").split(","):
            self.push.send(encode(self.control(msg)))

    def control(self, msg: ControlReq) -> ControlResp:
        if isinstance(msg, GetLoad):
            return ControlResp(call_id=msg.call_id, ok=True, result={
                "num_running_reqs": len(self.running), "num_queue_reqs": 0,
                "num_tokens": sum(len(r.req.input_ids) + len(r.generated)
                                  for r in self.running.values()),
                "num_aborted": self.num_aborted, "num_received": self.num_received})
        if isinstance(msg, FlushCache):
            if self.running:
                return ControlResp(call_id=msg.call_id, ok=False, error="requests are running")
            return ControlResp(call_id=msg.call_id, ok=True)
        if isinstance(msg, ServerInfo):
            return ControlResp(call_id=msg.call_id, ok=True,
                               result={"pid": os.getpid(), "engine": "fake"})
        if isinstance(msg, Shutdown):
            self.stop = True
            return ControlResp(call_id=msg.call_id, ok=True)
        return ControlResp(call_id=msg.call_id, ok=False, error=f"unknown method {msg.method}")

    def step(self) -> list[ReqOutput]:
        outs = []
        for rid, run in list(self.running.items()):
            sp = run.req.sampling_params
            token = (run.last + 1) % self.vocab_size
            run.last = token
            run.generated.append(token)
            n = len(run.generated)
            reason: dict[str, Any] | None = None
            if n >= sp.min_new_tokens:
                if token in sp.stop_token_ids or (token in self.eos_ids and not sp.ignore_eos):
                    reason = {"type": "stop", "matched": token}
                elif sp.stop and self.tokenizer is not None:
                    text = self.tokenizer.decode(run.generated)
                    hit = next((s for s in sp.stop if s in text), None)
                    if hit is not None:
                        reason = {"type": "stop", "matched": hit}
            if reason is None and n >= sp.max_new_tokens:
                reason = {"type": "length", "length": n}
            out = ReqOutput(rid=rid, new_token_ids=[token], prompt_tokens=len(run.req.input_ids),
                            completion_tokens=n, finish_reason=reason)
            if run.req.return_logprob:
                lp = -0.01 - (token % 7) / 10
                out.output_token_logprobs = [TokenLogprob(lp, token)]
                top = [TokenLogprob(lp - j, (token + j) % self.vocab_size)
                       for j in range(run.req.top_logprobs_num)]
                out.output_top_logprobs = [top]
            outs.append(out)
            if reason is not None:
                del self.running[rid]
        return outs

    def stats(self) -> EngineStats:
        used = sum(len(r.req.input_ids) + len(r.generated) for r in self.running.values())
        return EngineStats(num_running_reqs=len(self.running), num_queue_reqs=0,
                           token_usage=used / 4096, gen_throughput=float(len(self.running)),
                           num_used_tokens=used, max_total_num_tokens=4096,
                           engine_stall_s=float(os.environ.get("FAKE_ENGINE_STALL_S", "0")))


def run_engine_process(server_args: ServerArgs, ready_conn: Connection) -> None:
    # Ctrl-C / a process-group SIGTERM also reach this child: the server owns shutdown
    # (it drains, then sends ControlReq "shutdown"), and we exit if it dies.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    if os.environ.get("FAKE_ENGINE_FAIL"):
        ready_conn.send_bytes(encode(EngineReady(ok=False, error=os.environ["FAKE_ENGINE_FAIL"])))
        return
    with open(os.path.join(server_args.model_path, "config.json")) as f:
        config = json.load(f)
    tokenizer = None
    tok_path = os.path.join(server_args.tokenizer_dir, "tokenizer.json")
    if os.path.isfile(tok_path):
        from tokenizers import Tokenizer
        tokenizer = Tokenizer.from_file(tok_path)
    eos = config.get("eos_token_id")
    eos_ids = eos if isinstance(eos, list) else ([eos] if eos is not None else [])
    ctx = zmq.Context()
    pull = ctx.socket(zmq.PULL)
    server_args.ensure_ipc_dir()
    pull.bind(server_args.frontend_to_engine_addr)
    push = ctx.socket(zmq.PUSH)
    push.connect(server_args.engine_to_frontend_addr)
    engine = FakeEngine(server_args, config["vocab_size"], eos_ids, tokenizer, push)
    context_length = server_args.context_length or config["max_position_embeddings"]
    ready_conn.send_bytes(encode(EngineReady(
        ok=True, model_path=server_args.model_path, served_model_name=server_args.model_name,
        architecture=config["architectures"][0], context_length=context_length,
        vocab_size=config["vocab_size"], eos_token_ids=eos_ids, max_total_num_tokens=4096,
        max_running_requests=server_args.max_running_requests, page_size=server_args.page_size,
        num_pages=4096 // server_args.page_size,
        disaggregation_mode=server_args.disaggregation_mode)))
    ready_conn.close()
    step_s = float(os.environ.get("FAKE_ENGINE_STEP_S", "0.005"))
    parent = multiprocessing.parent_process()
    next_step = next_stats = time.monotonic()
    while not engine.stop:
        if parent is not None and not parent.is_alive():
            break  # never outlive the server
        timeout_ms = max(0, int((next_step - time.monotonic()) * 1000)) if engine.running else 50
        if pull.poll(timeout_ms):
            while pull.poll(0):
                engine.handle(decode_to_engine(pull.recv()))
        now = time.monotonic()
        stats = None
        if now >= next_stats:
            stats, next_stats = engine.stats(), now + 0.2
        if engine.running and now >= next_step:
            next_step = now + step_s
            engine.send(engine.step(), stats)
        elif stats is not None:
            engine.send([], stats)
    time.sleep(0.05)  # let the shutdown answer leave before the sockets close
    pull.close(0)
    push.close(100)
    ctx.term()
