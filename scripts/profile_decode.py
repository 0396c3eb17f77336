#!/usr/bin/env python3
"""Profile the offline engine on a decode-heavy batch with pyinstrument; writes a text tree.

  python scripts/profile_decode.py --model-path DIR --load-format dummy --batch 32 \
      --output docs/profiles/decode_b32.txt
"""

from __future__ import annotations

import argparse
import random
from pathlib import Path

from pyinstrument import Profiler

from sglang_pd import Engine


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model-path", required=True)
    ap.add_argument("--load-format", default="auto", choices=["auto", "dummy"])
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--input-len", type=int, default=128)
    ap.add_argument("--output-len", type=int, default=64)
    ap.add_argument("--output", default="docs/profiles/decode_b32.txt")
    args = ap.parse_args()
    rng = random.Random(0)
    with Engine(model_path=args.model_path, load_format=args.load_format, skip_tokenizer_init=True,
                max_running_requests=args.batch, max_total_tokens=1 << 17) as engine:
        vocab = engine.core.vocab_size
        prompts = [[rng.randrange(100, vocab - 100) for _ in range(args.input_len)] for _ in range(args.batch)]
        params = {"max_new_tokens": args.output_len, "temperature": 0.0, "ignore_eos": True}
        engine.generate(input_ids=prompts[:2], sampling_params={**params, "max_new_tokens": 4})  # warm-up
        profiler = Profiler(interval=0.001)
        profiler.start()
        engine.generate(input_ids=prompts, sampling_params=params)
        profiler.stop()
    text = profiler.output_text(unicode=False, color=False, show_all=False)
    Path(args.output).parent.mkdir(parents=True, exist_ok=True)
    Path(args.output).write_text(text)
    print(text[:4000])
    print(f"written to {args.output}")


if __name__ == "__main__":
    main()
