"""`art-proxy judge`: RULER scores ready groups. `JudgeChoice` is the part the trainer's whole loop
takes too (which judge, served where, answering how, by which rubric)."""

from __future__ import annotations

import math
from enum import StrEnum
from typing import Any

from pydantic import Field, ValidationInfo, field_validator

from art_proxy.config.shared import PiiSettings, ReportSettings, Settings, StoreSettings
from art_proxy.records import JudgeMode


class JudgeChoice(Settings):
    """Which judge scores a group, where it is served, by which rubric and in which mode."""

    judge: list[str] = Field(
        description="Judge model as litellm names it: openai/MODEL (with --judge-base-url for "
        "vLLM, local-llm or art-proxy), anthropic/MODEL, ...; repeat for an ensemble, whose "
        "scores are averaged."
    )
    judge_base_url: list[str] = Field(
        default_factory=list,
        description="Base URL of an OpenAI-compatible judge, ending in /v1: one for every "
        "judge, or one per --judge in the same order (unset = the provider's).",
    )
    rubric: str | None = Field(
        None,
        description="Rubric file: plain text, or a checklist of weighted criteria in .json, "
        ".yaml or .yml (unset = RULER's).",
    )
    judge_mode: JudgeMode = Field(
        "json",
        description="json: a score and explanation per trajectory; logprob: one digit each, "
        "scored by the digits' probabilities (small local judges).",
    )
    judge_orders: int = Field(
        2,
        ge=1,
        le=8,
        description="Orders each group is shown to the judge in (the given, the reversed, then "
        "rotations); a trajectory's score is its mean over them, so a judge that favours a "
        "position cannot reward it. 1 = the given order only (half the judge calls).",
    )
    judge_thinking_tokens: int = Field(
        0,
        ge=0,
        description="Room for a reasoning judge's thinking (Qwen3, DeepSeek-R1...), added to "
        "each answer's token cap where the judge's server says its context: its thinking counts "
        "against the cap. 0 = a judge that answers at once.",
    )
    judge_check_below: float = Field(
        0.3,
        ge=-1.0,
        le=1.0,
        description="A judge check fails below this Kendall tau: between the orders a group is "
        "judged in, or with the agent's own rewards where it returns them (ruler/check.py).",
    )

    @field_validator("judge", "judge_base_url", mode="before")
    @classmethod
    def _one_is_a_list_of_one(cls, value: Any) -> Any:
        return [value] if isinstance(value, str) else value

    @field_validator("judge_base_url")
    @classmethod
    def _base_urls_are_http(cls, urls: list[str], info: ValidationInfo) -> list[str]:
        """One http(s) URL for every judge, or one per --judge."""
        for url in urls:
            if not url.startswith(("http://", "https://")):
                raise ValueError(f"judge base URL {url!r} is not an http(s) URL")
        judges = len(info.data.get("judge") or [])
        if len(urls) > 1 and len(urls) != judges:
            raise ValueError(f"{len(urls)} base URLs for {judges} judges: give one, or one each")
        return [url.rstrip("/") for url in urls]

    @property
    def base_urls(self) -> list[str | None]:
        """The base URL of each judge, in the order of `judge`."""
        if len(self.judge_base_url) == len(self.judge):
            return list(self.judge_base_url)
        return [self.judge_base_url[0] if self.judge_base_url else None] * len(self.judge)


class ProgrammaticFor(StrEnum):
    validation = "validation"


# The temperature of an ensemble of samples when none is given: the judge's own distribution.
_SAMPLING_TEMPERATURE = 1.0


class JudgeSettings(JudgeChoice, StoreSettings, ReportSettings, PiiSettings):
    judge_api_key: str | None = Field(
        None, description="Key for the judge (unset = the provider's usual environment variable)."
    )
    judge_samples: int = Field(
        1,
        ge=1,
        description="Answers asked of each judge, averaged as an ensemble; above 1 the judge "
        "samples at --judge-temperature.",
    )
    watch: bool = Field(
        False, description="Keep judging groups as they become ready (Ctrl-C stops)."
    )
    group_size: int = Field(
        0, ge=0, description="Trajectories in a full group, judged at once (0 = unknown: wait)."
    )
    wait: float = Field(
        600.0,
        ge=0,
        description="Seconds after a group's newest trajectory started before it is judged with "
        "the members that finished (at least two; fewer is recorded as skipped).",
    )
    poll: float = Field(5.0, gt=0, description="Seconds between looks at the store with --watch.")
    check: bool = Field(
        False,
        description="Check the judge instead of judging: judge the newest --check-groups groups "
        "in 2 or more orders, storing nothing, and exit 1 when its scores follow position or "
        "noise (--judge-check-below).",
    )
    check_groups: int = Field(8, ge=1, description="Groups a --check judges.")
    concurrency: int = Field(4, ge=1, description="Groups judged at once.")
    judge_max_prompt_tokens: int = Field(
        32_000,
        ge=0,
        description="Judge prompt budget in tokens; long texts are trimmed in the middle to fit "
        "(0 = no limit). A judge whose server says its context (vLLM, local-llm: /v1/models "
        "max_model_len) also gets prompts that leave room in it for the answer and a re-ask.",
    )
    judge_attempts: int = Field(
        3, ge=1, description="Answers asked of the judge for a group before it is judge_failed."
    )
    judge_retries: int = Field(
        4, ge=0, description="Retries of an unreachable or rate-limited judge, backing off."
    )
    judge_backoff: float = Field(
        1.0, ge=0, description="Seconds before the first retry; doubles with each retry."
    )
    judge_timeout: float = Field(300.0, gt=0, description="Seconds to wait for one judge answer.")
    judge_temperature: float | None = Field(
        None,
        ge=0,
        description="Judge sampling temperature (unset = 0, greedy and the most consistent; "
        f"{_SAMPLING_TEMPERATURE:g} with --judge-samples above 1).",
    )
    reward_mix: str | None = Field(
        None,
        description="A,B: reward = A * the reward the agent reported at finish + B * the RULER "
        "score; a trajectory that reported none gets its RULER score (unset = the RULER score).",
    )
    programmatic_for: ProgrammaticFor | None = Field(
        None,
        description="validation: record the reward the agent reported beside the RULER score, "
        "for validation only; the reward stays the RULER score.",
    )
    retry_failed: bool = Field(
        False, description="Judge again the groups whose judgments all failed (once per run)."
    )

    @field_validator("judge_temperature")
    @classmethod
    def _samples_differ(cls, temperature: float | None, info: ValidationInfo) -> float | None:
        if temperature == 0 and info.data.get("judge_samples", 1) > 1:
            raise ValueError("--judge-samples above 1 needs a temperature above 0")
        return temperature

    @field_validator("reward_mix")
    @classmethod
    def _mix_is_two_weights(cls, mix: str | None) -> str | None:
        if mix is not None:
            _weights(mix)
        return mix

    @field_validator("programmatic_for")
    @classmethod
    def _mixed_or_kept_apart(
        cls, use: ProgrammaticFor | None, info: ValidationInfo
    ) -> ProgrammaticFor | None:
        if use is not None and info.data.get("reward_mix") is not None:
            raise ValueError("the programmatic reward is either mixed in (--reward-mix) or not")
        return use

    @property
    def temperature(self) -> float:
        if self.judge_temperature is not None:
            return self.judge_temperature
        return _SAMPLING_TEMPERATURE if self.judge_samples > 1 else 0.0

    @property
    def reward_weights(self) -> tuple[float, float] | None:
        """(A, B) of --reward-mix."""
        return None if self.reward_mix is None else _weights(self.reward_mix)


def judging_as_it_goes(choice: JudgeChoice, store: str) -> JudgeSettings:
    """The judge settings of a command that judges the groups it makes (`train --agent`,
    `eval`): its choice of judge, the rest `art-proxy judge`'s defaults, the prompt fitted to
    the judge's context alone."""
    return JudgeSettings(
        store=store,
        judge=choice.judge,
        judge_base_url=choice.judge_base_url,
        judge_mode=choice.judge_mode,
        judge_orders=choice.judge_orders,
        judge_thinking_tokens=choice.judge_thinking_tokens,
        judge_check_below=choice.judge_check_below,
        rubric=choice.rubric,
        judge_max_prompt_tokens=0,
    )


def _weights(mix: str) -> tuple[float, float]:
    parts = mix.split(",")
    try:
        a, b = (float(part) for part in parts)
    except ValueError:
        raise ValueError(f"reward mix {mix!r} is not two numbers A,B (e.g. 0.5,0.5)") from None
    if not all(math.isfinite(w) and w >= 0 for w in (a, b)) or a + b == 0:
        raise ValueError(f"reward mix {mix!r}: the weights must be 0 or more, not both 0")
    return a, b
