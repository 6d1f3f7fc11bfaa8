"""How the fake vLLM answers: its configuration, every knob with a default.

`FakeVllmConfig()` is a plain vLLM serving Qwen2.5-0.5B; the knobs script its replies (text, tool
calls by turn), its latency and its failures. See `fake_engine` for what it generates from them.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from art_proxy.testing.fake_tokenizer import IM_END_ID


class ScriptedCall(BaseModel):
    """A tool call the fake makes at its turn of `tool_script`."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(description="An offered tool (else a 400).")
    arguments: dict[str, Any] = Field(default_factory=dict)


class FakeVllmConfig(BaseModel):
    """How the fake answers. Every knob has a default, so `FakeVllmConfig()` is a plain vLLM."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    model: str = Field("Qwen/Qwen2.5-0.5B-Instruct", description="Served name of the base model.")
    max_model_len: int = Field(2048, ge=1, description="Context length in tokens, prompt included.")
    allow_runtime_lora: bool = Field(
        True, description="Serve /v1/load_lora_adapter and /v1/unload_lora_adapter (else 404)."
    )
    sleep_mode: bool = Field(
        False,
        description="Serve POST /sleep?level=N, POST /wake_up and GET /is_sleeping (vLLM with "
        "--enable-sleep-mode and VLLM_SERVER_DEV_MODE=1); else 404, as vLLM without them.",
    )
    reply: str = Field("Hello from the fake.", description="Assistant text of choice 0.")
    answer_after_tool: str | None = Field(
        None,
        description="Assistant text of choice 0 when the last message is a tool result (None = "
        "reply): with tool_call, a scripted agent turn that calls a tool with `reply` as its "
        "argument, then answers this.",
    )
    delay_s: float = Field(0.0, ge=0, description="Seconds to wait before answering (0 = none).")
    chunk_delay_s: float = Field(0.0, ge=0, description="Seconds between stream chunks (0 = none).")
    tokens_per_chunk: int = Field(
        1, ge=1, description="Generated ids carried by each stream chunk."
    )
    fail_mid_stream: bool = Field(
        False, description="Streams send one token chunk, then an error event, then [DONE]."
    )
    error_status: int = Field(
        0, description="Answer every valid generation request with this HTTP error (0 = off)."
    )
    tool_call: bool = Field(
        True,
        description="Call the first tool when tools are offered and the last message is not a "
        "tool result (False = always answer text, unless tool_choice names or requires a tool).",
    )
    tool_script: tuple[ScriptedCall, ...] = Field(
        (),
        description="Tool calls by turn, for multi-step agents: a request whose conversation holds "
        "k assistant messages, with tools offered and tool_choice auto or required, calls "
        "tool_script[k]; past its end the fake answers as without a script.",
    )
    record_requests: bool = Field(
        True, description="Keep each generation request body (off for long benchmark runs)."
    )
    eos_token_id: int = Field(IM_END_ID, description="Id that ends a turn (Qwen's <|im_end|>).")
