"""Position debiasing: a group judged in several orders, each trajectory's score its mean.

LLM judges favour positions: a small judge shown `t1 ... t4` in one fixed order may score by the
order alone (the bundled SmolLM2 judge's scores rose with the labels in every judgment of a walk
through the README), and GRPO would then train the agent on noise. So RULER shows the group in
`orders` different orders (`--judge-orders`, 2 by default): the given one, the reversed one, then
rotations of the given one. A trajectory's label is its position in each order, so every order
is its own prompt; the answers are mapped back onto the first order's labels (t1 is the first
order's first trajectory throughout the judgment) and averaged as an ensemble's members are. How
much the orders agree is recorded with the judgment (`order_agreement`, the mean Kendall tau-b
between every two orders' scores): near 1, the judge looked at the trajectories; near 0 or below,
at where they stood.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from itertools import combinations
from statistics import fmean

from art_proxy.ruler.ensemble import kendall_tau_b
from art_proxy.ruler.parse import ParsedScore


def permutations(size: int, orders: int) -> list[list[int]]:
    """Up to `orders` distinct orders of `size` members, as indices into the given order: the
    given, the reversed, then the given rotated by a step each (fewer when `size` has fewer)."""
    given = list(range(size))
    found = [given]
    candidates = [given[::-1]]
    candidates += [given[shift:] + given[:shift] for shift in range(1, size)]
    for order in candidates:
        if len(found) >= orders:
            break
        if order not in found:
            found.append(order)
    return found


def relabelled(
    scores: Mapping[str, ParsedScore], shown: Mapping[str, str], first: Mapping[str, str]
) -> dict[str, ParsedScore]:
    """An order's scores (by the labels it showed: `shown`, label -> trajectory id) under the
    first order's labels (`first`). Its explanations are left out: they name its own labels,
    which mean other trajectories in the first order's."""
    label_of = {trajectory: label for label, trajectory in first.items()}
    return {
        label_of[shown[label]]: ParsedScore(score.score, "", score.criteria)
        for label, score in scores.items()
    }


def order_agreement(
    by_order: Sequence[Sequence[Mapping[str, ParsedScore]]], labels: Sequence[str]
) -> float | None:
    """Mean Kendall tau-b between every two orders' scores (each order's: the mean of its
    scored members'); None with fewer than two orders scored."""
    means = [
        [fmean(member[label].score for member in members) for label in labels]
        for members in by_order
        if members
    ]
    if len(means) < 2:
        return None
    return fmean(kendall_tau_b(x, y) for x, y in combinations(means, 2))
