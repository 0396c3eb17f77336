"""Non-negative least squares on normal equations, small and exact: the solver behind
``cost_model.PrefillCostModel``'s online fit. Pure Python (a handful of features; no numpy
needed, and the fit must give the same numbers everywhere)."""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence


def solve_normal(A: list[float], v: list[float], idx: Sequence[int]) -> list[float] | None:
    """Solve the normal equations A theta = v (A row-major, len(v) x len(v)) restricted to
    ``idx`` (Jacobi-scaled Gaussian elimination); None when singular."""
    n_f = len(v)
    n = len(idx)
    d = [math.sqrt(A[i * n_f + i]) if A[i * n_f + i] > 0 else 1.0 for i in idx]
    M = [[A[idx[r] * n_f + idx[c]] / (d[r] * d[c]) for c in range(n)] + [v[idx[r]] / d[r]]
         for r in range(n)]
    for r in range(n):
        M[r][r] += 1e-12  # keeps an unexplored direction from dividing by zero
    for col in range(n):
        piv = max(range(col, n), key=lambda r: abs(M[r][col]))
        if abs(M[piv][col]) < 1e-300:
            return None
        M[col], M[piv] = M[piv], M[col]
        for r in range(col + 1, n):
            f = M[r][col] / M[col][col]
            if f:
                for c in range(col, n + 1):
                    M[r][c] -= f * M[col][c]
    x = [0.0] * n
    for r in range(n - 1, -1, -1):
        x[r] = (M[r][n] - sum(M[r][c] * x[c] for c in range(r + 1, n))) / M[r][r]
    return [xi / di for xi, di in zip(x, d)]


def nnls(A: list[float], v: list[float]) -> list[float] | None:
    """argmin over theta >= 0 of theta'A theta - 2 v'theta: the free solution when it is
    non-negative, else the best non-negative solution over every support (2^n: exact for the
    cost model's five features)."""
    n_f = len(v)
    full = solve_normal(A, v, range(n_f))
    if full is not None and min(full) >= 0:
        return full
    best, best_obj = None, math.inf
    for k in range(n_f - 1, 0, -1):
        for idx in itertools.combinations(range(n_f), k):
            sol = solve_normal(A, v, idx)
            if sol is None or min(sol) < 0:
                continue
            theta = [0.0] * n_f
            for i, s in zip(idx, sol):
                theta[i] = s
            obj = sum(theta[i] * A[i * n_f + j] * theta[j] for i in range(n_f) for j in range(n_f)) \
                - 2 * sum(t * vi for t, vi in zip(theta, v))
            if obj < best_obj:
                best, best_obj = theta, obj
    return best
