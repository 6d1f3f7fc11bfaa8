"""`art-proxy train`: the command around the GRPO algorithm's knobs (`trainer.py`)."""

from __future__ import annotations

from enum import StrEnum
from typing import Literal

from pydantic import Field, model_validator

from art_proxy.config.judge import JudgeChoice
from art_proxy.config.shared import ReportSettings, StoreSettings, UpstreamSettings
from art_proxy.config.trainer import TrainerConfig
from art_proxy.records import ScenarioSplit


class RewardSource(StrEnum):
    """Where the trainer reads the reward of a group's members from."""

    judgment = "judgment"
    finish = "finish"
    teacher = "teacher"


class TrainSettings(JudgeChoice, UpstreamSettings, StoreSettings, ReportSettings, TrainerConfig):
    """`art-proxy train`: the sidecar (train on scored groups) or, with --agent, the whole loop."""

    # Optional here, unlike `art-proxy judge`'s: the whole loop judges only when given a judge.
    judge: list[str] = Field(
        default_factory=list,
        description="RULER judge(s) for the whole loop, as `art-proxy judge --judge` (unset: "
        "the reward the agent returns).",
    )
    proxy: str = Field(
        "http://127.0.0.1:8100", description="The proxy whose model alias the trainer moves."
    )
    admin_key: str | None = Field(None, description="The proxy's admin key, when it has one.")
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
    teacher: str | None = Field(
        None,
        description="On-policy distillation: a teacher model that scores every token the agent "
        "sampled (its logprob after the same ids, vLLM's prompt_logprobs); each token's "
        "advantage gains --teacher-weight x (log p_teacher - the sampler's logprob). It must "
        "share the student's tokenizer and be served by vLLM or local-llm (--teacher-base-url).",
    )
    teacher_base_url: str | None = Field(
        None,
        description="The server of --teacher, ending in /v1 (default: the first --upstream: "
        "the same model, taught by --teacher-context).",
    )
    teacher_api_key: str | None = Field(
        None, description="Bearer key sent to the teacher's server (never stored or logged)."
    )
    teacher_context: str | None = Field(
        None,
        description="A text file shown to the teacher and not the student (context "
        "distillation): a system prompt, a hint, a worked example; added to each call's "
        "system message, the student's own completion scored after it. Without --teacher the "
        "teacher is the student's base model on the first --upstream (self-distillation).",
    )
    teacher_context_from: Literal["hint", "reference"] | None = Field(
        None,
        description="The whole loop: also show the teacher each scenario's own hint, or its "
        "reference answer, after --teacher-context (a scenario without one: the file's alone). "
        "Without --teacher the student's base model teaches itself with it.",
    )
    metrics_port: int | None = Field(
        None,
        ge=1,
        le=65535,
        description="Also serve each step's figures for Prometheus on this port, every "
        "interface (GET /metrics: rewards, loss, swaps, the last step's time; no trajectory "
        "content). Without it they are only written to --out/metrics.prom.",
    )
    steps: int = Field(
        0,
        ge=0,
        description="Stop after this many GRPO steps (0 = never); a warm start's (--sft) come "
        "first and are not counted.",
    )
    resume: bool = Field(
        False,
        description="Go on with the run in --out although its store, agent, scenarios or base "
        "model differ from this command's (refused otherwise: it would be someone else's run).",
    )
    groups_per_step: int = Field(2, ge=1, description="Scored groups consumed by one step.")
    max_off_policy_steps: int = Field(
        0,
        ge=0,
        description="The whole loop: sample later steps' rollouts while a step trains, by "
        "whichever adapter the alias serves, at most this many changes of the weights behind "
        "those they are trained into (rollouts wait beyond it; an abandoned step changes none); "
        "0 = alternate: sample, train, sample. Needs --keep-adapters above it. The sidecar: "
        "groups more than this many changes behind are consumed as stale.",
    )
    max_staleness: int = Field(
        16,
        ge=0,
        description="Staleness is how many steps behind the trained weights the adapter that "
        "served a group is (production traffic served by a promoted adapter, groups queued while "
        "the trainer was busy). Groups up to this many steps behind are trained, corrected by "
        "--objective; older ones are consumed as stale; 0 = no limit.",
    )
    newest_first: bool = Field(
        False,
        description="When more groups are ready than a step takes, train the newest first "
        "(the least stale) instead of the oldest.",
    )
    judge_check: bool = Field(
        True,
        description="The whole loop with --judge: check the judge on the first step's groups "
        "(ruler/check.py) and stop before training when its scores follow position or noise "
        "(--judge-check-below). The sidecar: stop before training on the scores of a judge "
        "whose newest `art-proxy judge --check` failed.",
    )
    guided_retries: bool = Field(
        False,
        description="The whole loop: run a scenario's group again with guidance (its scenario's "
        "hint, else --guide) when every rollout's reward is at most --guide-below; the trainer "
        "scores the retry's tokens without the guidance, importance-weighted.",
    )
    guide: str | None = Field(
        None, description="--guided-retries' guidance for scenarios without a hint of their own."
    )
    guide_below: float = Field(
        0.0, description="--guided-retries: a group whose rewards are all at most this failed."
    )
    reward_source: RewardSource = Field(
        RewardSource.judgment,
        description="judgment: RULER's stored scores; finish: the rewards agents reported at "
        "finish (the whole loop picks finish when it has no --judge); teacher: every ended "
        "group, rewarded or not, its unrewarded members trained on --teacher's term alone "
        "(distillation from production traffic with no judge and no rewards).",
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
    canary_fraction: list[float] = Field(
        default_factory=list,
        description="With --promote-alias: a validated candidate first serves this share of the "
        "production alias's new trajectories beside its target (a canary; each trajectory stays "
        "on its arm), and is promoted, rolled back or dropped when an anytime-valid interval on "
        "the difference in live reward says so (--canary-alpha, --canary-min-effect). Repeat it "
        "for stages (0.05, then 0.25): a stage widens to the next once it has served "
        "--canary-stage-trajectories without a decision. Unset or 0 = promote on validation "
        "alone, roll back on --rollback-margin.",
    )
    canary_alpha: float = Field(
        0.05,
        gt=0,
        lt=0.5,
        description="The canary's error rate: the chance that it promotes or rolls back a "
        "candidate no better or worse than the target, however often it looks.",
    )
    canary_min_effect: float = Field(
        0.05,
        gt=0,
        description="The smallest difference in live reward worth acting on: a canary whose "
        "interval lies within +/- this ends with the target kept.",
    )
    canary_stage_trajectories: int = Field(
        30,
        ge=10,
        description="With several --canary-fraction shares: the scored trajectories a stage "
        "serves on the candidate, still undecided, before it widens to the next share (at "
        "least 10: a stage's evidence counts from 10 an arm).",
    )
    canary_max_trajectories: int = Field(
        6000,
        ge=20,
        description="A canary still undecided once this many of its trajectories are scored "
        "ends with the target kept (an equal candidate can take thousands to tell apart), so a "
        "newer candidate gets its turn.",
    )
    canary_gate_samples: int = Field(
        64,
        ge=0,
        description="Before a canary starts: the newest shadow samples (serve --shadow-fraction) "
        "the target drew, reweighed to estimate the candidate's reward off-policy; a candidate "
        "estimated below the target by more than --canary-min-effect is held back before any "
        "user sees it (0 = no such gate).",
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
    agent: str | None = Field(
        None,
        description="The whole loop: module:function or file.py:function, an async agent "
        "run on the scenarios through the proxy each step, or exec:COMMAND (as eval's).",
    )
    scenarios: str | None = Field(None, description="Scenarios JSONL for --agent.")
    scenario: list[str] = Field(
        default_factory=list,
        description="The sidecar trains only on groups of this scenario id (repeat for several; "
        "default: every group in the store).",
    )
    group_size: int = Field(
        8,
        ge=2,
        description="Rollouts per scenario per step (--agent); for the sidecar with "
        "--reward-source finish or teacher, the finished members that make a group ready at once.",
    )
    group_wait: float = Field(
        600.0,
        ge=0,
        description="Sidecar with --reward-source finish or teacher: seconds after a group's newest member "
        "started before it is trained with fewer than --group-size members (as the judge's "
        "--wait).",
    )
    concurrency: int = Field(8, ge=1, description="Rollouts run at once (--agent).")
    sleep_upstreams: bool = Field(
        False,
        description="Whole loop on one GPU (--agent): put vLLM to sleep (level 1) during each "
        "training step and wake it before the next rollouts, freeing its memory for the step; "
        "vLLM needs --enable-sleep-mode and VLLM_SERVER_DEV_MODE=1 (up --sleep-mode).",
    )
    rollout_timeout: float = Field(
        300.0, ge=0, description="Seconds one rollout may take (0 = no limit)."
    )
    seed: int = Field(0, description="Seeds torch and the order scenarios are drawn in.")
    threads: int = Field(
        0,
        ge=0,
        description="CPU threads for torch (0 = one per core the process may use); as "
        "local-llm's --threads, to share the cores between the two.",
    )
    nproc: int = Field(
        1,
        ge=1,
        description="Training processes (ranks) on this machine, one per device: each holds "
        "the model and trains its share of each step's sequences, DDP averaging the adapter's "
        "gradients (gloo on CPUs, NCCL on GPUs); 1 = one process. Across machines, run "
        "`torchrun ... -m art_proxy.cli train` on each instead.",
    )
    device: Literal["auto", "cpu", "cuda"] = Field(
        "auto",
        description="Where to train: auto, the GPU when torch sees one (rank N: GPU N), else "
        "the CPU. On one GPU shared with vLLM, leave the trainer room (vLLM's "
        "--gpu-memory-utilization) or train on the CPU.",
    )
    sharding: Literal["ddp", "fsdp"] = Field(
        "ddp",
        description="With several ranks: ddp, each holds the whole model; fsdp, each holds "
        "1/N of every weight (FSDP2), for a base too large for one device.",
    )
    collective_timeout: float = Field(
        300.0,
        gt=0,
        description="Seconds a rank waits for the others before the run stops with an error "
        "(with --nproc or under torchrun); it also bounds the start: every rank must join and "
        "load the model within it of the first.",
    )

    sft: str | None = Field(
        None,
        description="Warm start before GRPO: fine-tune the adapter on demonstrations, a JSONL "
        "file of conversations (OpenAI's chat fine-tuning format, or `art-proxy export` lines) "
        "or `store` (the store's finished trajectories, chosen by --sft-split, --sft-min-reward, "
        "--sft-model and --scenario). Assistant turns are learnt (tool calls included); prompts "
        "and tool results are not.",
    )
    sft_epochs: int = Field(3, ge=1, description="Passes over the demonstrations (--sft).")
    sft_learning_rate: float | None = Field(
        None,
        gt=0,
        description="AdamW step size of the warm-start steps (unset: --learning-rate); "
        "supervised steps take a larger one than GRPO's.",
    )
    sft_batch_size: int = Field(8, ge=1, description="Demonstrations per warm-start step.")
    sft_split: ScenarioSplit = Field(
        "train",
        description="--sft store: trajectories of this split (validation is never trained on).",
    )
    sft_min_reward: float | None = Field(
        None,
        description="--sft store: only trajectories whose reward (reported at finish) is at "
        "least this.",
    )
    sft_model: str | None = Field(
        None,
        description="--sft store: only trajectories this model served (e.g. the hosted model "
        "whose traces are the demonstrations).",
    )
    sft_only: bool = Field(
        False,
        description="Stop after the warm start (a later `art-proxy train` with the same --out "
        "goes on with GRPO from it).",
    )

    @model_validator(mode="after")
    def _a_teacher_for_its_flags(self) -> TrainSettings:
        if not self.distils:
            named = [
                flag
                for flag, given in (
                    ("--teacher-base-url", self.teacher_base_url),
                    ("--no-group-advantage", not self.group_advantage or None),
                )
                if given is not None
            ]
            if self.reward_source is RewardSource.teacher:
                named.append("--reward-source teacher")
            if named:
                raise ValueError(f"{', '.join(named)} needs --teacher MODEL or --teacher-context")
        elif self.teacher is None and self.teacher_base_url is not None:
            raise ValueError("--teacher-base-url needs --teacher MODEL: the model it serves")
        if self.teacher_context_from is not None and not (self.agent and self.scenarios):
            raise ValueError(
                "--teacher-context-from reads the scenarios: it is for --agent with --scenarios"
            )
        return self

    @property
    def distils(self) -> bool:
        """Whether a teacher scores the sampled tokens: --teacher, or a context alone
        (--teacher-context, --teacher-context-from: the student's own base model, shown it)."""
        return (
            self.teacher is not None
            or self.teacher_context is not None
            or self.teacher_context_from is not None
        )

    @property
    def teacher_url(self) -> str:
        """Where the teacher is served: --teacher-base-url, else the first upstream."""
        return (self.teacher_base_url or self.upstream[0]).rstrip("/")

    @model_validator(mode="after")
    def _guided_retries_weighted_by_tis(self) -> TrainSettings:
        # A hinted token's weight pi/mu is far from 1 by design (the hint changed mu): mis would
        # leave most of them out, and ppo would clip around the hinted sampler.
        if self.guided_retries and self.objective != "tis":
            raise ValueError(
                f"--guided-retries needs --objective tis (not {self.objective}): the guided "
                "tokens are importance-weighted against the sampler that saw the hint"
            )
        return self

    @property
    def staleness_bound(self) -> int:
        """How many steps behind the trained weights a group may be and still be trained (0: no
        limit): --max-staleness, tightened to --max-off-policy-steps where that is set. The whole
        loop's pipeline never samples past K; the sidecar cannot hold production traffic back,
        so past K its groups are consumed as stale."""
        bounds = [b for b in (self.max_staleness, self.max_off_policy_steps) if b]
        return min(bounds, default=0)

    @model_validator(mode="after")
    def _overlap_within_staleness(self) -> TrainSettings:
        # ppo clips around the sampler, which overlap makes an older policy: it stalls on such
        # data (benchmarks/README.md, off_policy); the decoupled objectives correct for it.
        if self.max_off_policy_steps and self.objective == "ppo":
            raise ValueError(
                "--max-off-policy-steps needs --objective tis or mis: rollouts sampled by "
                "earlier weights are corrected by the decoupled objective"
            )
        if self.max_off_policy_steps and self.sleep_upstreams:
            raise ValueError(
                "--max-off-policy-steps samples while a step trains, and --sleep-upstreams puts "
                "vLLM to sleep for each step: choose one"
            )
        if self.max_off_policy_steps and self.keep_adapters <= self.max_off_policy_steps:
            # A rollout sampled K steps behind runs on an adapter K swaps old: with no more kept,
            # each swap could unload one a running rollout is about to call (and only its lease,
            # once the proxy sees it, would keep it).
            raise ValueError(
                f"--keep-adapters {self.keep_adapters} is at or below --max-off-policy-steps "
                f"{self.max_off_policy_steps}: keep at least {self.max_off_policy_steps + 1} "
                "adapters loaded, so those the overlapped rollouts sample from stay"
            )
        if self.max_staleness and self.max_off_policy_steps > self.max_staleness:
            raise ValueError(
                f"--max-off-policy-steps {self.max_off_policy_steps} is past --max-staleness "
                f"{self.max_staleness}: its groups would be consumed as stale, untrained"
            )
        return self

    @model_validator(mode="after")
    def _sft_never_on_validation(self) -> TrainSettings:
        if self.sft == "store" and self.sft_split == "val":
            raise ValueError("--sft-split val: validation trajectories are never trained on")
        if self.sft_only and self.sft is None:
            raise ValueError("--sft-only needs --sft (the demonstrations to warm-start on)")
        return self

    @model_validator(mode="after")
    def _sleep_only_in_the_whole_loop(self) -> TrainSettings:
        if self.sleep_upstreams and self.agent is None:
            raise ValueError(
                "--sleep-upstreams is for the whole loop (--agent): a sidecar trains beside "
                "production traffic, which a sleeping vLLM would not answer"
            )
        return self

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

    @model_validator(mode="after")
    def _a_canary_is_for_promotion(self) -> TrainSettings:
        shares = self.canary_shares
        if shares and self.promote_alias is None:
            raise ValueError(
                "--canary-fraction splits the production alias's traffic: it needs --promote-alias"
            )
        if 0 in shares:
            raise ValueError("--canary-fraction 0 means no canary: give it alone, or drop it")
        if any(not 0 < share < 1 for share in shares):
            raise ValueError(
                "--canary-fraction must be below 1: the target keeps a share to compare with "
                "(the last stage's verdict promotes)"
            )
        if list(shares) != sorted(set(shares)):
            raise ValueError("--canary-fraction's stages must increase (0.05, then 0.25)")
        return self

    @property
    def canary_shares(self) -> tuple[float, ...]:
        """The canary's stages (none: no canary; a lone 0 says so too)."""
        return () if self.canary_fraction in ([], [0.0]) else tuple(self.canary_fraction)

    @property
    def run_name(self) -> str:
        return self.run or (self.out.rstrip("/").rsplit("/", 1)[-1] or "art-train")
