"""Group ranks -> scalar rewards for RAPO (docs/algorithms/rapo.md). Pure functions.

Ranks are 1-based, 1 = best, and ties share the average of the positions they cover
(``[1, 2.5, 2.5, 4]``, :func:`rapo_echo.llm.ranks.average_ranks`). Everything here is magnitude-free:
only the order inside a group matters.
"""

from __future__ import annotations

from collections.abc import Sequence


def _check_ranks(ranks: Sequence[float]) -> int:
    size = len(ranks)
    if size == 0:
        raise ValueError("ranks must not be empty")
    bad = [r for r in ranks if not 1 <= r <= size]
    if bad:
        raise ValueError(f"ranks must lie in [1, {size}] for a group of {size}, got {list(ranks)}")
    return size


def linear_rank_rewards(ranks: Sequence[float]) -> list[float]:
    """``r_i = (G - rank_i) / (G - 1)`` in [0, 1]: best 1, worst 0; a group of one gets ``[1.0]``."""
    size = _check_ranks(ranks)
    if size == 1:
        return [1.0]
    return [(size - r) / (size - 1) for r in ranks]


def gopo_advantages(ranks: Sequence[float]) -> list[float]:
    """GOPO's rank advantages (arXiv 2602.03876): ``A_i = 2 - 4 (rank_i - 1) / (G - 1)``, best +2, worst
    -2, zero-mean when the ranks are average ranks; a group of one gets ``[0.0]``."""
    size = _check_ranks(ranks)
    if size == 1:
        return [0.0]
    return [2.0 - 4.0 * (r - 1) / (size - 1) for r in ranks]


def mix_emotion(
    rank_rewards: Sequence[float], deltas: Sequence[float | None], *, mix: float, scale: float
) -> list[float | None]:
    """Blend rank rewards with the simulated emotion change: ``(1 - mix) r + mix (delta / scale + 1) / 2``.

    ``delta`` in ``[-scale, scale]`` maps onto [0, 1]. With ``mix == 0`` the rank reward is returned
    as is (a missing delta does not matter); with ``mix > 0`` a ``None`` delta gives ``None`` (invalid).
    """
    if not 0.0 <= mix <= 1.0:
        raise ValueError(f"mix must be in [0, 1], got {mix}")
    if scale <= 0:
        raise ValueError(f"scale must be > 0, got {scale}")
    if len(rank_rewards) != len(deltas):
        raise ValueError(f"got {len(rank_rewards)} rank rewards but {len(deltas)} emotion deltas")
    out: list[float | None] = []
    for i, (r, d) in enumerate(zip(rank_rewards, deltas)):
        if mix == 0.0:
            out.append(float(r))
            continue
        if d is None:
            out.append(None)
            continue
        if not -scale <= d <= scale:
            raise ValueError(f"emotion delta {i} is {d}, outside [-{scale}, {scale}]")
        out.append((1.0 - mix) * r + mix * (d / scale + 1.0) / 2.0)
    return out


def rank_of_extra(ranks: Sequence[float], extra: int, original: int) -> float:
    """The extra candidate's rank minus the original's (negative: the correction beat the original)."""
    for name, i in (("extra", extra), ("original", original)):
        if not 0 <= i < len(ranks):
            raise IndexError(f"{name} index {i} is outside a group of {len(ranks)}")
    return float(ranks[extra]) - float(ranks[original])
