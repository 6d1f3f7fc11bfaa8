"""`art-proxy scenarios generate`: tasks written by an LLM from an agent's tools or real openings."""

from __future__ import annotations

from pydantic import Field, field_validator, model_validator

from art_proxy.config.shared import PiiSettings, StoreSettings
from art_proxy.records import Split

# Room in a writer's answer for a reasoning model's thinking (which counts against max_tokens).
THINKING_TOKENS = 1024


class ScenarioWriterSettings(StoreSettings, PiiSettings):
    mcp: str | None = Field(
        None, description="Command that starts the agent's MCP server (stdio): its tools."
    )
    tools: str | None = Field(
        None, description="JSON file of the agent's tools (OpenAI's form or MCP's tools/list)."
    )
    from_store: bool = Field(
        False, description="Real openings from the store's scenario bank (--split) as examples."
    )
    split: Split = Field("prod", description="With --from-store: the split whose openings to show.")
    examples: int = Field(20, ge=1, description="With --from-store: openings shown to the writer.")
    count: int = Field(20, ge=1, description="Scenarios to write.")
    writer: str = Field(
        description="Writer model as litellm names it: openai/MODEL (with --writer-base-url for "
        "vLLM or art-proxy local-llm), anthropic/MODEL, ..."
    )
    writer_base_url: str | None = Field(
        None, description="Base URL of an OpenAI-compatible writer, ending in /v1."
    )
    writer_api_key: str | None = Field(None, description="The writer's key (else the provider's).")
    temperature: float = Field(
        0.7, ge=0, le=2, description="The writer's sampling temperature (lower: more alike)."
    )
    writer_thinking_tokens: int = Field(
        THINKING_TOKENS,
        ge=0,
        description="Room for a reasoning writer's thinking in each answer, beside the tasks': "
        "its thinking counts against the answer's token cap.",
    )
    val_fraction: float = Field(
        0.2, ge=0, le=1, description="Share of the scenarios put in the val split."
    )
    seed: int = Field(0, description="Seed of the train/val split.")
    out: str = Field("-", description="Scenarios JSONL to write (- = standard output).")

    @field_validator("writer_base_url")
    @classmethod
    def _http(cls, url: str | None) -> str | None:
        if url is not None and not url.startswith(("http://", "https://")):
            raise ValueError(f"writer base URL {url!r} is not an http(s) URL")
        return url.rstrip("/") if url else url

    @model_validator(mode="after")
    def _one_source(self) -> ScenarioWriterSettings:
        sources = [self.mcp is not None, self.tools is not None, self.from_store]
        if sum(sources) != 1:
            raise ValueError("pass exactly one of --mcp, --tools and --from-store")
        return self
