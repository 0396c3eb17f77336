"""Online serving benchmark: workloads, backends, metrics, reports and plots.

Entry point: ``python -m sglang_pd.bench_serving``; trace loaders: :mod:`sglang_pd.bench.traces`.
"""
