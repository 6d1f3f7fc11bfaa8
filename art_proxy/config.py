"""Typed settings. No I/O here: the CLI builds them from flags and `ART_PROXY_*` variables."""

from __future__ import annotations

from enum import StrEnum

from pydantic import BaseModel, ConfigDict, Field, field_validator

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


class JudgeSettings(StoreSettings):
    judge: str = Field(
        description="Judge model as litellm names it: openai/MODEL (with --judge-base-url for "
        "vLLM, local-llm or art-proxy), anthropic/MODEL, ..."
    )
    judge_base_url: str | None = Field(
        None,
        description="Base URL of an OpenAI-compatible judge, ending in /v1 (unset = the "
        "provider's).",
    )
    judge_api_key: str | None = Field(
        None, description="Key for the judge (unset = the provider's usual environment variable)."
    )
    rubric: str | None = Field(None, description="Text file with the rubric (unset = RULER's).")
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
    judge_temperature: float = Field(
        0.0, ge=0, description="Judge sampling temperature (0 = greedy, the most consistent)."
    )
    retry_failed: bool = Field(
        False, description="Judge again the groups whose judgments all failed (once per run)."
    )

    @field_validator("judge_base_url")
    @classmethod
    def _base_url_is_http(cls, url: str | None) -> str | None:
        if url is not None and not url.startswith(("http://", "https://")):
            raise ValueError(f"judge base URL {url!r} is not an http(s) URL")
        return url.rstrip("/") if url else url


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
