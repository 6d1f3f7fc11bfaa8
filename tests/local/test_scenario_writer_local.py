"""Scenario generation with the bundled model as the writer, served by the embedded server: the
smallest writer a user has, reached through litellm as any other. What it writes is no benchmark
of quality; the path works end to end and its lines become valid scenarios."""

from __future__ import annotations

from art_proxy.local.server import RunningLocalLlm
from art_proxy.ruler.judge import LitellmJudge
from art_proxy.scenario_writer import MAX_CHARS, MIN_CHARS, Tool, tools_prompt, write_scenarios

TOOLS = [
    Tool(
        "get_weather", "The weather in a city today.", {"properties": {"city": {"type": "string"}}}
    ),
    Tool("convert_currency", "Convert an amount between currencies.", {}),
]


async def test_the_bundled_model_writes_scenarios_for_a_tool_list(
    local_llm: RunningLocalLlm,
) -> None:
    writer = LitellmJudge(
        "openai/SmolLM2-135M-Instruct", base_url=local_llm.base_url, temperature=1.0
    )
    try:
        await writer.check()  # as `art-proxy scenarios generate` does: the server's context
        written = await write_scenarios(
            writer,
            lambda count, avoid: tools_prompt(TOOLS, count, avoid),
            count=4,
            val_fraction=0.25,
        )
    finally:
        await writer.aclose()

    assert 1 <= written.rounds <= 3 and written.lines >= 1
    assert written.scenarios, "the bundled model wrote no line that could be a task"
    for scenario in written.scenarios:
        assert MIN_CHARS <= len(scenario.input) <= MAX_CHARS
        assert scenario.metadata["generated_by"] == "openai/SmolLM2-135M-Instruct"
    assert len({s.id for s in written.scenarios}) == len(written.scenarios)
