"""`art-proxy rollout`: an agent run on scenarios through the proxy, one group per scenario."""

from __future__ import annotations

from pydantic import Field, field_validator

from art_proxy.config.shared import Settings
from art_proxy.records import ScenarioSplit


class AgentRunSettings(Settings):
    """An agent run on scenarios through the proxy (`rollout`, `eval`)."""

    agent: str = Field(
        description="The agent: module.path:function or path/to/file.py:function, an async "
        "function taking an art_proxy.rollout.Rollout; or exec:COMMAND, a command run once a "
        "rollout with the task as its last argument and OPENAI_BASE_URL set (its reward: a last "
        "line `reward: X`)."
    )
    scenarios: str = Field(
        description='Scenarios file: JSONL, one {"input": ..., "id", "split", "reference", '
        '"metadata"} a line (only input is required).'
    )
    proxy: str = Field("http://127.0.0.1:8100", description="Root URL of the art-proxy to call.")
    concurrency: int = Field(8, ge=1, description="Rollouts running at once, over all scenarios.")
    timeout: float = Field(
        300.0, ge=0, description="Seconds one rollout may take before it is cut (0 = no limit)."
    )
    split: ScenarioSplit | None = Field(
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


class RolloutSettings(AgentRunSettings):
    """`art-proxy rollout`: run an agent group-size times on every scenario through the proxy."""

    group_size: int = Field(
        4, ge=1, description="Rollouts per scenario, recorded as one group (RULER ranks them)."
    )
    # The name `art-proxy local-llm` serves its bundled model under (local/model_loading.py).
    model: str = Field(
        "SmolLM2-135M-Instruct", description="Model name the agent calls (the trainer's alias)."
    )
