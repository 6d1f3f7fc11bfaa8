"""A LangGraph ReAct agent through the real proxy in front of the real local-llm (SmolLM2).

SmolLM2-135M will not call a tool on cue (and, shown one, greedily calls it again and again), so
the sampler is scripted: a Hermes tool call, then the answer. Everything else is real: SmolLM2's
forward passes, the chat template and tool rendering, the tool-call parser, the token ids the proxy
records, and the stitching of the second call onto the first, which holds only if the template
renders the parsed tool call back to the very ids the model produced.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import httpx
import pytest
import torch
from langchain_core.runnables import RunnableConfig
from langchain_core.tools import tool
from langgraph.prebuilt import create_react_agent

from art_proxy.local import engine as engine_module
from art_proxy.local.model_loading import LoadedModel
from art_proxy.local.sampling import Sampled, SamplingParams
from art_proxy.local.served import ServedModel
from art_proxy.local.server import running_local_llm
from art_proxy.proxy.server import running_proxy
from art_proxy.vllm_api.engine import TokenLogprob
from art_proxy_integrations.langgraph import ArtProxyCallback, chat_model
from tests.conftest import proxy_settings, trajectories

pytestmark = pytest.mark.filterwarnings("ignore:create_react_agent has been moved")

TOOL_CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Rome"}}\n</tool_call>'
ANSWER = "It is sunny in Rome."


@tool
def get_weather(city: str) -> str:
    """Weather of a city."""
    return f"sunny in {city}"


Sampler = Callable[
    [torch.Tensor, Sequence[SamplingParams], Sequence[torch.Generator | None]], Sampled
]


def scripted(ids: list[int]) -> Sampler:
    """Answer ids[0], ids[1], ... one row at a time, whatever the logits say."""
    steps = iter(ids)

    def sample_next(
        logits_B_V: torch.Tensor,
        params_B: Sequence[SamplingParams],
        generators_B: Sequence[torch.Generator | None],
    ) -> Sampled:
        return Sampled([next(steps)], [TokenLogprob(-0.5, ())])

    return sample_next


async def test_react_agent_on_smollm2_is_one_trajectory_with_its_tool_call_stitched(
    smollm2: LoadedModel,
    sqlite_url: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    eos = smollm2.tokenizer.eos_token_id
    assert isinstance(eos, int)
    tool_call_ids: list[int] = [*smollm2.tokenizer(TOOL_CALL)["input_ids"], eos]
    answer_ids: list[int] = [*smollm2.tokenizer(ANSWER)["input_ids"], eos]
    monkeypatch.setattr(engine_module, "sample", scripted([*tool_call_ids, *answer_ids]))
    # The tools' description and the tool turns outgrow the 512 ids of the `local_llm` fixture.
    served = ServedModel.create(smollm2, max_model_len=2048, max_batch_size=1)

    async with (
        running_local_llm(served) as local_llm,
        running_proxy(proxy_settings(sqlite_url, local_llm.base_url)) as proxy,
        httpx.AsyncClient() as http,
    ):
        handler = ArtProxyCallback(
            proxy.root_url,
            scenario="weather-rome",
            reward_fn=lambda outputs: float(len(outputs["messages"])),
        )
        llm = chat_model(
            proxy.root_url, served.name, http_async_client=http, max_tokens=32, temperature=0.0
        )
        agent = create_react_agent(llm, [get_weather])
        config: RunnableConfig = {"callbacks": [handler]}
        outputs = await agent.ainvoke(
            {"messages": [{"role": "user", "content": "What is the weather in Rome?"}]}, config
        )
        [trajectory] = await trajectories(proxy)

    roles = [message.type for message in outputs["messages"]]
    assert roles == ["human", "ai", "tool", "ai"]
    assert outputs["messages"][2].content == "sunny in Rome"
    assert outputs["messages"][3].content == ANSWER
    assert trajectory.status == "finished" and trajectory.finish_reason == "client"
    assert trajectory.reward == 4.0
    assert trajectory.calls is not None and len(trajectory.calls) == 2
    first, second = trajectory.calls
    assert first.response is not None
    [call] = first.response["choices"][0]["message"]["tool_calls"]
    assert call["function"] == {"name": "get_weather", "arguments": '{"city": "Rome"}'}
    assert first.completion_token_ids == [tool_call_ids]
    assert second.completion_token_ids == [answer_ids]
    # The second prompt extends the first prompt plus the ids SmolLM2 "sampled": one sequence.
    assert second.stitched and second.trainable
    assert first.prompt_token_ids is not None and second.prompt_token_ids is not None
    assert second.prompt_token_ids[: len(first.prompt_token_ids) + len(tool_call_ids)] == [
        *first.prompt_token_ids,
        *tool_call_ids,
    ]
