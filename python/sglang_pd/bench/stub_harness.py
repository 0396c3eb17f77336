"""Helpers around the stub server: start it in a child process, and a toy tokenizer.

Used by the tests and by the demo/accuracy scripts; nothing here is needed to benchmark a real
server.
"""

from __future__ import annotations

import contextlib
import os
import random
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

from sglang_pd.utils.server_procs import require_healthy


def write_toy_tokenizer(model_dir: str | Path, vocab_size: int = 600) -> Path:
    """Train a small byte-level BPE on generated text and save ``model_dir/tokenizer.json``.

    Lets tests and demos exercise the text backends (exact-count prompts) without a real model.
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    words = ["serving", "model", "token", "prefill", "decode", "cache", "batch", "request", "latency", "throughput", "goodput", "schedule", "queue", "page", "kernel", "tensor", "layer", "attention", "router", "trace"]
    rng = random.Random(0)
    corpus = [
        " ".join(rng.choice(words) for _ in range(16)) + rng.choice(".,!?") for _ in range(1500)
    ]
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=["<s>", "</s>", "<pad>"],
        show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator(corpus, trainer)
    out = Path(model_dir)
    out.mkdir(parents=True, exist_ok=True)
    tok.save(str(out / "tokenizer.json"))
    return out / "tokenizer.json"


@contextlib.contextmanager
def running_stub(*flags: str, start_timeout_s: float = 20.0) -> Iterator[str]:
    """Run the stub in a child process (so it never competes for our GIL); yield its base URL.

    Waits for ``/health``; always stops the child on exit.
    """
    env = dict(os.environ)
    pkg_root = str(Path(__file__).resolve().parents[2])  # .../python, for uninstalled checkouts
    env["PYTHONPATH"] = pkg_root + os.pathsep + env.get("PYTHONPATH", "")
    # stdout carries only the ready line; stderr goes to a file, never to a pipe nobody drains
    # (a full pipe would block the stub mid-run).
    log = tempfile.TemporaryFile(mode="w+")  # noqa: SIM115 (closed once the stub has stopped)
    proc = subprocess.Popen(
        [sys.executable, "-m", "sglang_pd.bench.stub_server", "--port", "0", *flags],
        stdout=subprocess.PIPE,
        stderr=log,
        text=True,
        env=env,
    )
    try:
        line = proc.stdout.readline() if proc.stdout else ""
        if not line.startswith("STUB_READY port="):
            proc.wait(timeout=10)
            log.seek(0)
            raise RuntimeError(f"stub server did not start: {line}{log.read()[-4000:]}")
        base = f"http://127.0.0.1:{int(line.strip().split('=')[1])}"
        require_healthy(base, proc, start_timeout_s)
        yield base
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)
        log.seek(0)
        errors = log.read()
        log.close()
        if "Traceback" in errors:  # a stub bug would otherwise only show up as odd client errors
            print(f"stub server stderr:\n{errors[-4000:]}", file=sys.stderr)
