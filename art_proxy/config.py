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
