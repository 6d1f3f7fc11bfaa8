"""How RULER judges: the rubric, the answer's form, the budgets and tries, the orders a group is
shown in, and the rule that turns scores into rewards."""

from __future__ import annotations

from dataclasses import dataclass, field

from art_proxy.records import JudgeMode
from art_proxy.ruler.errors import RubricError
from art_proxy.ruler.reward import RewardRule
from art_proxy.ruler.rubric import Rubric


@dataclass(frozen=True)
class RulerSettings:
    rubric: Rubric
    mode: JudgeMode = "json"
    max_prompt_tokens: int = 32_000  # 0 = no limit
    attempts: int = 3  # answers asked for before judge_failed
    retries: int = 4  # extra tries of an unreachable or rate-limited call
    backoff: float = 1.0  # seconds before the first retry; doubles each time
    samples: int = 1  # answers asked of each judge (several: sample at a temperature above 0)
    orders: int = 1  # orders each group is shown in (orders.py): position debiasing
    thinking_tokens: int = 0  # a reasoning judge's room to think, beside its answer's
    reward: RewardRule = field(default_factory=RewardRule)

    def __post_init__(self) -> None:
        if not isinstance(self.rubric, str) and self.mode != "json":
            raise RubricError(
                "a checklist rubric needs --judge-mode json (logprob mode reads one digit per "
                "trajectory)"
            )
