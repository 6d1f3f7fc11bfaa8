"""The judgment cache: the store itself, keyed by judge (or ensemble), mode and rendered prompt.

The rendered prompt holds the rubric and the serialized group, so the key changes exactly when
the judge would see something else. A hit costs no call: its scores are mapped, by the labels the
judge saw, onto the trajectories of the group being scored (the same group judged again, or a
group recorded with exactly the same conversations), and rewarded afresh by the current reward
rule. Only `scored` judgments with no failed ensemble member are reused: a failure is worth
another try later.
"""

from __future__ import annotations

import hashlib
import json
import uuid
from collections.abc import Mapping

from art_proxy.records import JudgeMode, Judgment
from art_proxy.ruler.prompt import JudgePrompt
from art_proxy.ruler.reward import RewardRule
from art_proxy.store.trajectory_store import utcnow

# Bumped when the prompt's meaning changes without its text changing (how answers are read).
_KEY_VERSION = 1


def cache_key(judge_model: str, mode: JudgeMode, prompt: JudgePrompt) -> str:
    serialized = json.dumps(
        {"v": _KEY_VERSION, "judge": judge_model, "mode": mode, "messages": prompt.messages},
        sort_keys=True,
        ensure_ascii=False,
    )
    return hashlib.sha256(serialized.encode()).hexdigest()


def reuse(
    cached: Judgment,
    group_id: str,
    labels: Mapping[str, str],
    rule: RewardRule,
    programmatic: Mapping[str, float | None],
) -> Judgment:
    """`cached`'s answer as a judgment of `group_id`, whose label -> trajectory id is `labels`,
    rewarded by `rule` from the members' `programmatic` rewards (trajectory id -> reward)."""
    scores = [
        score.model_copy(update={"trajectory_id": labels[score.label]}) for score in cached.scores
    ]
    free = {"attempts": 0, "prompt_tokens": 0, "completion_tokens": 0, "cost_usd": 0.0}
    return cached.model_copy(
        update={
            "id": uuid.uuid4().hex,
            "group_id": group_id,
            "trajectory_ids": list(labels.values()),
            "scores": rule.apply(scores, programmatic),
            "members": [member.model_copy(update=free) for member in cached.members],
            "reward_rule": rule.name,
            **free,
            "cached_from": cached.cached_from or cached.id,
            "created_at": utcnow(),
        }
    )


def reusable(cached: Judgment) -> bool:
    """Whether a stored judgment may answer for a new one: scored, by every ensemble member."""
    return cached.status == "scored" and all(m.status == "scored" for m in cached.members)
