"""`art-proxy eval`: an agent run on held-out scenarios against several models, side by side."""

from __future__ import annotations

from pydantic import Field, field_validator

from art_proxy.config.judge import JudgeChoice
from art_proxy.config.rollout import AgentRunSettings
from art_proxy.config.shared import StoreSettings
from art_proxy.records import ScenarioSplit


class EvalSettings(AgentRunSettings, JudgeChoice, StoreSettings):
    """`art-proxy eval`: is the trained model better than the base, or a hosted one?"""

    model: list[str] = Field(
        description="An arm to evaluate; repeat for each: base, trained (the base model's "
        "alias: the trainer's newest adapter), an alias or ALIAS@STEP, "
        "openai/MODEL (OPENAI_API_KEY), NAME@URL (any OpenAI-compatible server); LABEL=SPEC "
        "names it in the report."
    )
    split: ScenarioSplit | None = Field(
        "val", description="The scenarios of this split (train, val, prod; unset = all)."
    )
    repeats: int = Field(4, ge=1, description="Rollouts of each scenario by each arm.")
    reference: str | None = Field(
        None, description="The arm each difference is taken against (unset = the first)."
    )
    out: str | None = Field(
        None, description="Directory for report.json, report.md and report.png (unset = none)."
    )
    price: list[str] = Field(
        default_factory=list,
        description="LABEL=USD_PER_HOUR: what an hour of a self-hosted arm's server costs; its "
        "cost per 1,000 rollouts is taken at the rollouts an hour it completed (hosted models: "
        "litellm's price table).",
    )
    arm_api_key: list[str] = Field(
        default_factory=list,
        description="LABEL=KEY: the key an arm's own server (NAME@URL) wants (never stored).",
    )
    arm_context: list[str] = Field(
        default_factory=list,
        description="LABEL=FILE: the arm's calls carry the file's text in their prompt (added "
        "to the system message, as a teacher's --teacher-context is): what a teacher shown it "
        "scores itself, before a run distils from it. Needs an agent that sends rollout.headers "
        "(not exec:).",
    )
    seed: int = Field(0, description="Seed of the judge's shuffles and the bootstraps.")
    # Optional here, unlike `art-proxy judge`'s: the agent's own reward needs no judge.
    judge: list[str] = Field(
        default_factory=list,
        description="Judge for rollouts the agent returns no reward for, as `art-proxy judge` "
        "names it; it ranks each scenario's rollouts of every arm together, arms unnamed and "
        "shuffled (unset = the agent's reward only).",
    )

    @field_validator("price", "arm_api_key", "arm_context")
    @classmethod
    def _label_pairs(cls, values: list[str]) -> list[str]:
        for value in values:
            label, equals, rest = value.partition("=")
            if not (label and equals and rest):
                raise ValueError(f"{value!r} is not LABEL=VALUE")
        return values

    @field_validator("price")
    @classmethod
    def _prices_are_numbers(cls, values: list[str]) -> list[str]:
        for value in values:
            try:
                dollars = float(value.partition("=")[2])
            except ValueError:
                dollars = -1.0
            if not dollars >= 0:
                raise ValueError(f"--price {value!r}: USD_PER_HOUR is a number, at least 0")
        return values

    @property
    def prices_per_hour(self) -> dict[str, float]:
        return {k: float(v) for k, _, v in (p.partition("=") for p in self.price)}

    @property
    def arm_keys(self) -> dict[str, str]:
        return {k: v for k, _, v in (p.partition("=") for p in self.arm_api_key)}

    @property
    def arm_contexts(self) -> dict[str, str]:
        """Label -> the context file's path."""
        return {k: v for k, _, v in (p.partition("=") for p in self.arm_context)}
