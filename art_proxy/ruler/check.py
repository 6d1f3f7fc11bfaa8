"""Is the judge worth training on? Two measures, before a run trusts its scores.

- Self-consistency: each group judged in more than one order (orders.py); the judgment's
  `order_agreement` is the mean Kendall tau-b between the orders' scores. A judge that reads the
  trajectories ranks them alike however they are shown (near 1); one that scores by position
  ranks them by where they stand (near 0, or below).
- Agreement with known rewards, where the agent returns one: Kendall tau-b between the judge's
  scores and the agent's rewards in each group whose rewards differ.

Each is the mean over the groups it could be measured on. A check passes when every measure it
could take reaches the threshold (`--judge-check-below`, 0.3 by default): below it, GRPO would
learn the judge's noise (the tool example: a judge at tau -0.02 with the task's reward unlearned
the tool, held-out success 0.08 -> 0.00).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from statistics import fmean

from art_proxy.records import Judgment
from art_proxy.ruler.ensemble import kendall_tau_b

# What to do when a check fails: the remedies, in the order to try them.
REMEDIES = (
    "a stronger judge (--judge, any OpenAI-compatible endpoint or litellm model), a rubric "
    "(--rubric) or a checklist of criteria (--rubric FILE.yaml)"
)


@dataclass(frozen=True)
class JudgeCheck:
    groups: int  # groups judged
    consistency: float | None  # mean tau between orders (None: not measured)
    agreement: float | None  # mean tau with the agent's rewards (None: none known)
    threshold: float

    @property
    def measures(self) -> list[float]:
        return [m for m in (self.consistency, self.agreement) if m is not None]

    @property
    def passed(self) -> bool:
        return bool(self.measures) and all(m >= self.threshold for m in self.measures)

    @property
    def failed(self) -> bool:
        """Measured, and below the threshold (nothing measured is neither)."""
        return bool(self.measures) and not self.passed

    def line(self) -> str:
        """One line: what was measured, and when it failed, what to do."""
        parts = []
        if self.consistency is not None:
            parts.append(f"its orders agree at Kendall tau {self.consistency:+.2f}")
        if self.agreement is not None:
            parts.append(f"it agrees with the agent's rewards at tau {self.agreement:+.2f}")
        if not parts:
            return (
                f"judge check: nothing to measure on {self.groups} groups (judge each group in "
                "2 or more orders, --judge-orders, or have the agent return a reward)"
            )
        measured = f"judge check on {self.groups} groups: " + ", ".join(parts)
        if self.passed:
            return f"{measured} (at least {self.threshold:g}): its scores can be trained on"
        return (
            f"{measured}, below {self.threshold:g}: its scores follow noise or position, not "
            f"quality. Try {REMEDIES}"
        )


def check_judgments(
    judgments: Sequence[Judgment], known: Mapping[str, float], threshold: float
) -> JudgeCheck:
    """The check of `judgments` (scored ones count), `known` the agent's rewards by trajectory."""
    scored = [j for j in judgments if j.status == "scored"]
    orders = [j.order_agreement for j in scored if j.order_agreement is not None]
    agreements = []
    for judgment in scored:
        pairs = [
            (s.score, known[s.trajectory_id]) for s in judgment.scores if s.trajectory_id in known
        ]
        rewards = [reward for _, reward in pairs]
        if len(pairs) >= 2 and len(set(rewards)) > 1:
            agreements.append(kendall_tau_b([score for score, _ in pairs], rewards))
    return JudgeCheck(
        groups=len(scored),
        consistency=fmean(orders) if orders else None,
        agreement=fmean(agreements) if agreements else None,
        threshold=threshold,
    )
