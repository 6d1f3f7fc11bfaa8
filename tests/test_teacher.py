"""The teacher client (art_proxy/teacher.py) against the fake vLLM, whose `prompt_logprobs` are a
known function of each id: what it asks, what it reads back, what it caches, and the one-line
refusals of a teacher that cannot score a student's tokens."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from aiohttp import web

from art_proxy.records import CallRecord, TrainableGroup
from art_proxy.scenarios import Scenario
from art_proxy.teacher import Teacher, TeacherError, scenario_contexts, trajectory_contexts
from art_proxy.testing.fake_engine import fake_prompt_logprob
from art_proxy.testing.fake_vllm import FakeVllm, FakeVllmConfig, running_fake_vllm
from art_proxy.testing.loopback import free_port
from tests.trainer.records import call


async def test_the_teacher_scores_each_completion_id_after_the_ids_before_it(
    vllm: FakeVllm,
) -> None:
    prompt, completion = [11, 12, 13, 14], [40, 41, 55]
    async with Teacher(vllm.base_url, vllm.config.model) as teacher:
        await teacher.check(vllm.base_url, vllm.config.model)
        scored = await teacher.logprobs(("call-1", 0), prompt, completion)
        again = await teacher.logprobs(("call-1", 0), prompt, completion)
    assert scored == tuple(fake_prompt_logprob(token_id) for token_id in completion)
    assert again == scored
    [*_, sent] = [body for body in vllm.requests if "prompt_logprobs" in body]
    assert sent["prompt"] == prompt + completion  # ids as they are: nothing re-tokenized
    assert sent["prompt_logprobs"] == 0 and sent["max_tokens"] == 1
    counted = teacher.counters
    assert (counted.tokens, counted.failed) == (3, 0)
    assert (
        counted.calls == 1
    )  # the repeat came from the cache (and the check's probe is not counted)


async def test_a_teacher_that_does_not_serve_the_model_is_refused_in_one_line(
    vllm: FakeVllm,
) -> None:
    async with Teacher(vllm.base_url, "some/other-model") as teacher:
        with pytest.raises(TeacherError, match="serves no model 'some/other-model'") as refused:
            await teacher.check(vllm.base_url, vllm.config.model)
    assert "\n" not in str(refused.value)


async def test_a_hosted_api_without_tokenize_or_prompt_logprobs_is_refused_naming_what_it_can_be(
    vllm: FakeVllm,
) -> None:
    """A chat-only server (what a hosted API looks like to the teacher): models listed, no
    /tokenize and no /v1/completions."""

    async def models(_: web.Request) -> web.Response:
        return web.json_response({"data": [{"id": "gpt-x"}]})

    app = web.Application()
    app.router.add_get("/v1/models", models)
    runner = web.AppRunner(app)
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    try:
        async with Teacher(f"http://127.0.0.1:{port}/v1", "gpt-x") as teacher:
            with pytest.raises(TeacherError, match="refused the tokenizer probe") as refused:
                await teacher.check(vllm.base_url, vllm.config.model)
    finally:
        await runner.cleanup()
    assert "judge" in str(refused.value) and "--sft" in str(refused.value)


async def test_an_unreachable_teacher_is_refused_after_its_retries(vllm: FakeVllm) -> None:
    async with Teacher(f"http://127.0.0.1:{free_port()}/v1", "m") as teacher:
        with pytest.raises(TeacherError, match=r"did not answer .* after 3 tries"):
            await teacher.check(vllm.base_url, vllm.config.model)


async def test_a_context_that_fills_the_teachers_window_is_refused_before_any_step() -> None:
    """Known at the check, not a failed call per step: the context alone leaves no room."""
    async with running_fake_vllm(FakeVllmConfig(max_model_len=64)) as small:
        fits = Teacher(small.base_url, small.config.model, context="Say one word.")
        async with fits as teacher:
            await teacher.check(small.base_url, small.config.model)
        long = " ".join(["Think of one word, then say it and nothing else."] * 20)
        async with Teacher(small.base_url, small.config.model, context=long) as teacher:
            with pytest.raises(TeacherError, match=r"--teacher-context is \d+ tokens, past") as no:
                await teacher.check(small.base_url, small.config.model)
    assert "context window of 64" in str(no.value) and "\n" not in str(no.value)


async def test_a_scenarios_own_hint_or_reference_is_shown_after_the_context(
    vllm: FakeVllm,
) -> None:
    """`--teacher-context-from hint|reference`: the scenario's own, added after the file's."""
    messages = [{"role": "user", "content": "Name a fruit."}]

    def recorded(call_id: str) -> CallRecord:
        return call(0, [1, 2, 3], [40, 41], [-0.5, -0.5], trajectory_id=call_id).model_copy(
            update={"request": {"messages": messages}}
        )

    sent: list[list[int]] = []
    for context, own in (("Be brief.\n\nApple", None), ("Be brief.", "Apple"), ("Be brief.", None)):
        async with Teacher(vllm.base_url, vllm.config.model, context=context) as teacher:
            await teacher.call_logprobs(recorded(f"t{len(sent)}"), 0, [1, 2, 3], own)
        [*_, body] = [b for b in vllm.requests if "prompt_logprobs" in b]
        sent.append(body["prompt"])
    assert sent[0] == sent[1] != sent[2]
    scenarios = [
        Scenario(id="a", input="Name a fruit.", hint="One word.", reference="Apple"),
        Scenario(id="b", input="Add", reference={"sum": 3}),
        Scenario(id="c", input="Nothing to show"),
    ]
    assert scenario_contexts(scenarios, "hint") == {"a": "One word."}
    assert scenario_contexts(scenarios, "reference") == {
        "a": "A correct answer: Apple",
        "b": 'A correct answer: {"sum": 3}',
    }
    assert scenario_contexts(scenarios, None) == {}
    # Each trained trajectory, rewarded or not, is shown its own scenario's.
    groups = [
        TrainableGroup(
            group_id=f"g{scenario}",
            scenario_id=scenario,
            split="train",
            created_at=datetime.now(UTC),
            rewards={f"{scenario}1": 1.0},
            unrewarded=[f"{scenario}2"],
        )
        for scenario in ("a", "c")
    ]
    assert trajectory_contexts(groups, scenario_contexts(scenarios, "hint")) == {
        "a1": "One word.",
        "a2": "One word.",
    }
