"""Personal data kept from the judge, the dashboard and export (`--redact-pii`), with Presidio.

The redactor runs on Presidio's pattern recognisers with no spaCy model and nothing fetched (the
network beyond loopback is off in tests). The judge is a scripted one on loopback that keeps
what it was sent; the dashboard and export are a real proxy's and the CLI's.
"""

from __future__ import annotations

import asyncio
import json
from datetime import UTC, datetime
from pathlib import Path

import aiohttp
import openai

from art_proxy.privacy.pii import pii_redactor
from art_proxy.proxy.server import running_proxy
from art_proxy.records import TeacherScore, TokenDisagreement
from art_proxy.records.evaluations import ArmResult, Estimate, EvaluationReport
from art_proxy.testing.fake_vllm import FakeVllm, FakeVllmConfig, running_fake_vllm
from tests.conftest import proxy_settings, trajectories
from tests.test_export import export

EMAIL, OTHER = "jane.doe@example.com", "bob@corp.io"
CARD, PHONE = "4111 1111 1111 1111", "+1 415-555-0132"
MODEL = "Qwen/Qwen2.5-0.5B-Instruct"


def test_the_same_value_gets_the_same_placeholder_and_structure_is_kept() -> None:
    placeholders = pii_redactor().placeholders()
    first = placeholders.text(f"write to {EMAIL} or call {PHONE}, card {CARD}")
    message = {
        "role": "assistant",
        "content": f"again {EMAIL}, and {OTHER}",
        "tool_calls": [
            {
                "id": "call_1",
                "type": "function",
                "function": {"name": "send", "arguments": json.dumps({"to": EMAIL})},
            }
        ],
    }
    second = placeholders.value(message)

    assert EMAIL not in first and PHONE not in first and CARD not in first
    assert (
        "<EMAIL_ADDRESS_1>" in first and "<PHONE_NUMBER_1>" in first and "<CREDIT_CARD_1>" in first
    )
    assert second["content"] == "again <EMAIL_ADDRESS_1>, and <EMAIL_ADDRESS_2>"
    assert json.loads(second["tool_calls"][0]["function"]["arguments"]) == {
        "to": "<EMAIL_ADDRESS_1>"
    }
    assert (second["role"], second["tool_calls"][0]["id"]) == ("assistant", "call_1")
    assert second["tool_calls"][0]["function"]["name"] == "send"
    assert placeholders.text("The table holds invoices.") == "The table holds invoices."


async def test_the_dashboard_and_export_show_placeholders_and_keep_the_token_ids(
    store_url: str, vllm: FakeVllm, http: aiohttp.ClientSession, tmp_path: Path
) -> None:
    settings = proxy_settings(store_url, vllm.base_url, redact_pii=True)
    async with running_proxy(settings) as proxy:
        async with openai.AsyncOpenAI(base_url=proxy.base_url, api_key="unused") as client:
            await client.chat.completions.create(
                model=MODEL,
                messages=[
                    {"role": "user", "content": f"my card is {CARD}, mail {EMAIL}", "name": OTHER}
                ],
            )
        [recorded] = await trajectories(proxy)
        admin = []
        routes = ("/art/v1/trajectories", f"/art/v1/trajectories/{recorded.id}")
        for path in (*routes, "/art/v1/scenarios"):  # a scenario keeps its opening
            async with http.get(proxy.root_url + path) as response:
                assert response.status == 200
                admin.append(await response.text())
        pages = []
        for path in (
            "/dashboard",
            f"/dashboard/trajectories/{recorded.id}",
            f"/dashboard/groups/{recorded.group_id}",
        ):
            async with http.get(proxy.root_url + path) as response:
                assert response.status == 200
                pages.append(await response.text())
    result = await asyncio.to_thread(export, "--store", store_url, "--redact-pii")

    for page in [*pages, *admin]:
        assert EMAIL not in page and CARD not in page and OTHER not in page
    assert "<EMAIL_ADDRESS_" in admin[1] and "<EMAIL_ADDRESS_" in admin[2]
    assert "&lt;CREDIT_CARD_1&gt;" in pages[1] and "&lt;EMAIL_ADDRESS_" in pages[1]
    assert result.returncode == 0, result.stderr
    [line] = [json.loads(text) for text in result.stdout.splitlines()]
    assert EMAIL not in result.stdout and CARD not in result.stdout and OTHER not in result.stdout
    assert "<EMAIL_ADDRESS_" in line["messages"][0]["content"]
    assert line["messages"][0]["name"].startswith("<EMAIL_ADDRESS_")  # who spoke is text
    [call] = line["trajectory"]["calls"]
    assert recorded.calls is not None
    assert call["prompt_token_ids"] == recorded.calls[0].prompt_token_ids  # never altered


def test_a_spacy_model_that_is_not_installed_is_a_one_line_error(sqlite_url: str) -> None:
    result = export("--store", sqlite_url, "--redact-pii", "--pii-spacy-model", "en_no_such_model")
    assert result.returncode == 1
    assert "--pii-spacy-model en_no_such_model: not installed" in result.stderr
    assert "Traceback" not in result.stderr


async def test_an_evaluation_report_on_the_dashboard_shows_placeholders(
    store_url: str, vllm: FakeVllm, http: aiohttp.ClientSession
) -> None:
    """A report keeps what its rollouts raised (`error`) and the agent's name: under
    --redact-pii the evaluations page shows them with placeholders like every other page."""
    unknown = Estimate(mean=None, low=None, high=None, n=0, method="none")
    report = EvaluationReport(
        id="e-pii",
        created_at=datetime.now(UTC),
        agent=f"agents/{OTHER}.py:rollout",
        scenarios=1,
        repeats=1,
        reward_source="agent",
        reference="base",
        arms=[
            ArmResult(
                label="base", model=MODEL, served_by="proxy", rollouts=1, failed=1,
                error=f"ValueError: no mailbox {EMAIL} (card {CARD})", reward=unknown,
                latency_p50_s=None, latency_p95_s=None, prompt_tokens=None,
                completion_tokens=None, cost_per_1000=None,
            )
        ],
    )  # fmt: skip
    settings = proxy_settings(store_url, vllm.base_url, redact_pii=True)
    async with running_proxy(settings) as proxy:
        await proxy.parts.store.add_evaluation(report)
        async with http.get(proxy.root_url + "/dashboard/evaluations") as response:
            assert response.status == 200
            page = await response.text()
    assert "no mailbox" in page  # the report is shown
    assert EMAIL not in page and CARD not in page and OTHER not in page
    assert "&lt;EMAIL_ADDRESS_1&gt;" in page


async def test_a_teachers_tokens_are_withheld_where_the_answer_holds_personal_data(
    store_url: str, http: aiohttp.ClientSession
) -> None:
    """The redactor reads whole text: `jane` alone is no address, so a token of an answer that
    held one is not shown at all; of an answer with nothing to redact it is."""
    async with running_fake_vllm(FakeVllmConfig(reply=f"Mail {EMAIL} today")) as llm:
        settings = proxy_settings(store_url, llm.base_url, redact_pii=True)
        async with running_proxy(settings) as proxy:
            async with openai.AsyncOpenAI(base_url=proxy.base_url, api_key="unused") as client:
                await client.chat.completions.create(
                    model=MODEL, messages=[{"role": "user", "content": "Whom do I write to?"}]
                )
            [recorded] = await trajectories(proxy)
            assert recorded.calls is not None
            [call] = recorded.calls
            await proxy.parts.store.record_teacher_scores(
                [
                    TeacherScore(
                        call_id=call.id,
                        choice=0,
                        trajectory_id=recorded.id,
                        run="run",
                        step=1,
                        teacher="teacher-model",
                        kl=0.75,
                        tokens=4,
                        disagreements=[
                            TokenDisagreement(position=1, text="jane", sampled=-0.5, teacher=-6.0)
                        ],
                        created_at=datetime.now(UTC),
                    )
                ]
            )
            async with http.get(f"{proxy.root_url}/dashboard/trajectories/{recorded.id}") as got:
                redacted = await got.text()
        async with running_proxy(proxy_settings(store_url, llm.base_url)) as plain:
            page = f"{plain.root_url}/dashboard/trajectories/{recorded.id}"
            async with http.get(page) as got:
                shown = await got.text()
    assert "<h2>Teacher</h2>" in redacted and "0.750" in redacted
    assert "[withheld]" in redacted and "jane" not in redacted
    assert "&#34;jane&#34;" in shown or '"jane"' in shown
