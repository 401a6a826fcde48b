"""A later chunk's attention over the prefix already cached: the fit's ``per_token_prefix``.

:func:`prefixes` reads, from each step's shape range alone (its tokens and requests, never
times), which prefill steps continue a carried-over request and how many (chunk token, cached
token) pairs each holds (``StepSizes.prefill_prefix``, docs/design.md "Prefill");
:func:`prefix_line` fits ``forward_us`` as ``{base, per_token, per_token_prefix}`` over them,
and :func:`token_line` the prefill's other lines, ``{base, per_token}``.
:mod:`simwar.fit.shapes` writes the prefill section with them.

Imports: numpy only.
"""

from __future__ import annotations

import numpy as np

#: the fewest steps over a carried-over request's prefix from which ``per_token_prefix`` is
#: fitted (:func:`prefix_line`)
MIN_PREFIX_STEPS = 3


def prefixes(kinds, chunk: int) -> tuple[dict[int, int], int]:
    """``(prefix per step, carried steps)``: per step that prefills tokens, its (chunk token,
    cached token) pairs (``StepSizes.prefill_prefix``: the tokens it prefills of a request
    times that request's tokens prefilled before), -1 where the ranges cannot say; and how
    many steps continued a carried-over request.

    Read from the ranges alone (each step's tokens and requests), never from times: a step
    continues a carried-over request when the step that prefilled before it used the whole
    budget (``chunk`` tokens, its decodes' counted where they took theirs first:
    ``StepKinds.budget``; SGLang's ``chunked_req`` is the last request of a chunk the budget
    cut),
    and that request comes first in it. A step that continues none has prefix 0 (each of its
    requests' first chunk). A step that continues one has a known prefix when it holds that
    request alone (its tokens are the step's) and the request's earlier chunks are known (it
    began alone in a step, and every step since held it alone); several requests in a step
    leave their shares unnamed (-1)."""
    out: dict[int, int] = {}
    carried_steps = 0
    last, held = -1, None  # the tokens of the step that prefilled before; the carried
    for k in sorted(kinds.tokens):  # request's tokens so far (None: not known)
        t, n = kinds.tokens[k], kinds.requests.get(k, -1)
        if t < 0:
            out[k], last, held = -1, -1, None
            continue
        carried = last >= chunk
        carried_steps += carried
        if not carried:
            out[k] = 0
            held = t if n == 1 else None  # the request the budget cuts, if this is full
        elif n == 1 and held is not None:
            out[k] = t * held
            held += t
        else:  # its carried request's share, or the earlier chunks', unnamed
            out[k] = -1
            held = None
        last = kinds.budget(k)  # its chunk, and its decodes' tokens where they took theirs
    return out, carried_steps


def prefix_line(x, prefix, y) -> tuple[dict | float, str]:
    """``{base, per_token, per_token_prefix}`` by least squares over the steps' tokens and
    prefixes with every coefficient >= 0: the best of the fits over each subset of the three
    terms whose coefficients are all >= 0 (three unknowns: the subsets are the exact
    non-negative least squares, without a solver the project does not otherwise need)."""
    x, p, y = (np.asarray(v, dtype=float) for v in (x, prefix, y))
    cols = {"base": np.ones_like(x), "per_token": x, "per_token_prefix": p}
    best, best_sse = None, np.inf
    for mask in range(1, 8):
        names = [n for i, n in enumerate(cols) if mask >> i & 1]
        a = np.column_stack([cols[n] for n in names])
        coef, *_ = np.linalg.lstsq(a, y, rcond=None)
        if np.any(coef < 0) or ("per_token_prefix" in names and coef[-1] * p.max() < 0.05):
            continue  # a prefix term worth less than 0.05 µs at the largest prefix: none
        sse = float(((a @ coef - y) ** 2).sum())
        if best is None or sse < best_sse * (1 - 1e-9):  # ties: the fewer terms
            best, best_sse = dict(zip(names, coef.tolist())), sse
    got = best or {}
    carried = int((p > 0).sum())
    out = {"base": _r(got.get("base", 0.0)), "per_token": _r6(got.get("per_token", 0.0))}
    if got.get("per_token_prefix", 0.0) > 0:
        out["per_token_prefix"] = float(f"{got['per_token_prefix']:.6g}")
    how = (f"least squares over {len(y)} steps, {int(x.min())}-{int(x.max())} tokens, "
           f"{carried} of them over a carried-over request's prefix, every term >= 0")
    return out, how


def token_line(x, y) -> tuple[dict | float, str]:
    """``{base, per_token}`` by least squares over the steps' tokens, clamped so that neither
    is negative (a negative slope: the mean; a negative base: the line through 0); tokens
    not named (``x`` < 0): the mean. Returns the value and how it was fitted."""
    x, y = np.asarray(x, dtype=float), np.asarray(y, dtype=float)
    if len(y) == 0:
        return 0.0, "no sample"
    if np.any(x < 0) or np.ptp(x) == 0:
        why = "the ranges name no tokens" if np.any(x < 0) else "one token count"
        return _r(max(float(y.mean()), 0.0)), f"mean of {len(y)} ({why})"
    slope, base = np.polyfit(x, y, 1)
    how = f"least squares over {len(y)} steps, {int(x.min())}-{int(x.max())} tokens"
    if slope < 0:
        return _r(max(float(y.mean()), 0.0)), how + f"; slope {slope:.4g} < 0: the mean"
    if base < 0:
        slope = float((x * y).sum() / (x * x).sum())
        return {"base": 0.0, "per_token": _r6(max(slope, 0.0))}, how + \
            "; base < 0: the line through 0"
    return {"base": _r(base), "per_token": _r6(slope)}, how


def _r(v: float) -> float:
    return round(float(v), 3)


def _r6(v: float) -> float:
    return round(float(v), 6)


__all__ = ["MIN_PREFIX_STEPS", "prefix_line", "prefixes", "token_line"]
