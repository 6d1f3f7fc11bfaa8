"""`art-proxy judge --redact-pii`: the judge sees placeholders for personal data, the same one
for the same value across the group, while the store keeps what was recorded."""

from __future__ import annotations

import json
from typing import Any

from art_proxy.privacy.pii import pii_redactor
from art_proxy.records import FeedbackRequest
from art_proxy.ruler.run import finished_members
from art_proxy.store.trajectory_store import TrajectoryStore
from tests.ruler.conftest import MakeRuler
from tests.ruler.recorded import OPENING, record_group
from tests.ruler.scripted_judge import answer_by_content, running_scripted_judge
from tests.test_pii import EMAIL, OTHER, PHONE


def said(text: str) -> list[Any]:
    return [*OPENING, {"role": "assistant", "content": text}]


async def test_the_judge_sees_placeholders_consistent_across_the_group(
    store: TrajectoryStore, make_ruler: MakeRuler
) -> None:
    group, ids = await record_group(
        store, [said(f"Sent to {EMAIL}."), said(f"Sent to {EMAIL} and {OTHER}.")]
    )
    await store.add_feedback(FeedbackRequest(trajectory_id=ids[0], comment=f"reach me at {PHONE}"))
    async with running_scripted_judge(answer_by_content(lambda _text: 0.5)) as judge:
        ruler = make_ruler(judge, redactor=pii_redactor())
        judgment = await ruler.score_group(group, await finished_members(store, group))
    prompt = json.dumps(judge.requests[0]["messages"])

    assert judgment.status == "scored"
    assert EMAIL not in prompt and OTHER not in prompt and "415-555-0132" not in prompt
    assert prompt.count("<EMAIL_ADDRESS_1>") == 2 and prompt.count("<EMAIL_ADDRESS_2>") == 1
    assert "<PHONE_NUMBER_1>" in prompt
    # What is stored is as it was: only what the judge is sent changes.
    stored = await store.calls(ids)
    assert EMAIL in json.dumps(stored[ids[0]][0].response)
