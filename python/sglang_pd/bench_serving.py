"""``python -m sglang_pd.bench_serving``: online load test (see docs/bench_serving.md)."""

from __future__ import annotations

import sys

from sglang_pd.bench.app import main

if __name__ == "__main__":
    sys.exit(main())
