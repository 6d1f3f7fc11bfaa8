"""Typed settings. No I/O here: the CLI builds them from flags and `ART_PROXY_*` variables."""

from __future__ import annotations

import math
from enum import StrEnum
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator

DEFAULT_STORE = "sqlite:///art.db"


class OnStoreError(StrEnum):
    serve = "serve"
    fail = "fail"


class StoreSettings(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    store: str = Field(
        DEFAULT_STORE,
        description="Store URL: sqlite:///FILE (default) or postgresql+asyncpg://USER@HOST/DB.",
    )


class ProxySettings(StoreSettings):
    upstream: list[str] = Field(
        default_factory=lambda: ["http://127.0.0.1:8000/v1"],
        description="Inference server base URL, ending in /v1; repeat for several replicas.",
    )
    upstream_api_key: str | None = Field(
        None, description="Bearer key sent to the upstream (never stored or logged)."
    )
    host: str = Field("127.0.0.1", description="Address to bind.")
    port: int = Field(8100, description="Port to bind (0 = any free port).")
    api_key: str | None = Field(None, description="Key clients must send as Bearer (unset = open).")
    admin_key: str | None = Field(
        None, description="Key the /art/ endpoints require (unset = open)."
    )
    idle_timeout: float = Field(
        300.0, description="Seconds without a call after which a trajectory finishes (0 = never)."
    )
    group_size: int = Field(
        0, description="Trajectories per group; a full group starts a new one (0 = unlimited)."
    )
    upstream_timeout: float = Field(
        600.0, description="Seconds to wait for the upstream (504 after)."
    )
    max_body_mb: float = Field(32.0, description="Largest request body in MiB (413 above).")
    on_store_error: OnStoreError = Field(
        OnStoreError.serve,
        description="serve: answer the agent and count the lost record; fail: answer 503.",
    )

    @field_validator("upstream")
    @classmethod
    def _upstreams_are_base_urls(cls, urls: list[str]) -> list[str]:
        if not urls:
            raise ValueError("at least one --upstream is needed")
        for url in urls:
            if not url.startswith(("http://", "https://")):
                raise ValueError(f"upstream {url!r} is not an http(s) URL")
        return [url.rstrip("/") for url in urls]


class ExportSettings(StoreSettings):
    out: str = Field("-", description="File to write JSONL to (- = standard output).")
    scenario: str | None = Field(None, description="Only this scenario.")
    status: str | None = Field(
        None, description="Only trajectories in this status (open, finished)."
    )
    split: str | None = Field(None, description="Only this split (train, val, prod).")


class JudgeModeOption(StrEnum):
    json = "json"
    logprob = "logprob"


class ProgrammaticFor(StrEnum):
    validation = "validation"


# The temperature of an ensemble of samples when none is given: the judge's own distribution.
_SAMPLING_TEMPERATURE = 1.0


class JudgeSettings(StoreSettings):
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
    judge_api_key: str | None = Field(
        None, description="Key for the judge (unset = the provider's usual environment variable)."
    )
    judge_samples: int = Field(
        1,
        ge=1,
        description="Answers asked of each judge, averaged as an ensemble; above 1 the judge "
        "samples at --judge-temperature.",
    )
    rubric: str | None = Field(
        None,
        description="Rubric file: plain text, or a checklist of weighted criteria in .json, "
        ".yaml or .yml (unset = RULER's).",
    )
    judge_mode: JudgeModeOption = Field(
        JudgeModeOption.json,
        description="json: a score and explanation per trajectory; logprob: one digit each, "
        "scored by the digits' probabilities (small local judges).",
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
    concurrency: int = Field(4, ge=1, description="Groups judged at once.")
    judge_max_prompt_tokens: int = Field(
        32_000,
        ge=0,
        description="Judge prompt budget in tokens; long texts are trimmed in the middle to fit "
        "(0 = no limit).",
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

    @field_validator("judge", "judge_base_url", mode="before")
    @classmethod
    def _one_is_a_list_of_one(cls, value: Any) -> Any:
        return [value] if isinstance(value, str) else value

    @field_validator("judge_base_url")
    @classmethod
    def _base_urls_are_http(cls, urls: list[str], info: ValidationInfo) -> list[str]:
        for url in urls:
            if not url.startswith(("http://", "https://")):
                raise ValueError(f"judge base URL {url!r} is not an http(s) URL")
        judges = len(info.data.get("judge") or [])
        if len(urls) > 1 and len(urls) != judges:
            raise ValueError(f"{len(urls)} base URLs for {judges} judges: give one, or one each")
        return [url.rstrip("/") for url in urls]

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
    def base_urls(self) -> list[str | None]:
        """The base URL of each judge, in the order of `judge`."""
        if len(self.judge_base_url) == len(self.judge):
            return list(self.judge_base_url)
        return [self.judge_base_url[0] if self.judge_base_url else None] * len(self.judge)

    @property
    def reward_weights(self) -> tuple[float, float] | None:
        """(A, B) of --reward-mix."""
        return None if self.reward_mix is None else _weights(self.reward_mix)


def _weights(mix: str) -> tuple[float, float]:
    parts = mix.split(",")
    try:
        a, b = (float(part) for part in parts)
    except ValueError:
        raise ValueError(f"reward mix {mix!r} is not two numbers A,B (e.g. 0.5,0.5)") from None
    if not all(math.isfinite(w) and w >= 0 for w in (a, b)) or a + b == 0:
        raise ValueError(f"reward mix {mix!r}: the weights must be 0 or more, not both 0")
    return a, b


class UpSettings(StoreSettings):
    model: str | None = Field(
        None, description="local-llm model: HF directory or .gguf file (default: bundled SmolLM2)."
    )
    vllm: str | None = Field(
        None, description="Start `vllm serve MODEL` (GPU) instead of the bundled local-llm."
    )
    max_lora_rank: int = Field(16, description="vLLM --max-lora-rank (vLLM mode only).")
    tool_call_parser: str = Field("hermes", description="vLLM --tool-call-parser (vLLM mode only).")
    host: str = Field("127.0.0.1", description="Address the proxy binds.")
    port: int = Field(8100, description="Port of the proxy.")
    llm_port: int = Field(8000, description="Port of the inference server.")
    run: str | None = Field(
        None,
        description="Once up, run this shell command with OPENAI_BASE_URL set, print what was "
        "recorded, and stop the stack when it ends.",
    )
