"""The groups a whole-loop run sampled for training, kept in its --out directory
(`sampled-groups.jsonl`), so that a run killed with groups sampled and not yet trained takes them
first when it resumes (loop.py), judged or not.

A line is appended (and flushed to disk) as soon as a group's rollouts have ended, before it is
judged or trained: which groups are the run's is read here, never guessed from the store, which
other runs share (the default `./art.db` serves every run started in a folder) and where a group
the base model sampled names no adapter of the run. Guided retries are not written: a retry
trains pooled with the group it retried, which only the live loop knows.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from pathlib import Path

from art_proxy.rollout import GroupReport

FILE_NAME = "sampled-groups.jsonl"


class SampledGroups:
    def __init__(self, out: Path) -> None:
        self.path = out / FILE_NAME

    def add(self, groups: Sequence[GroupReport]) -> None:
        """Record `groups` as the run's."""
        if not groups:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        lines = "".join(
            json.dumps({"group": g.group_id, "scenario": g.scenario_id}) + "\n" for g in groups
        )
        with self.path.open("a") as file:
            file.write(lines)
            file.flush()
            os.fsync(file.fileno())

    def group_ids(self) -> list[str]:
        """Every group the run sampled, oldest first (a line a kill cut short is skipped)."""
        if not self.path.is_file():
            return []
        ids: list[str] = []
        for line in self.path.read_text().splitlines():
            try:
                ids.append(str(json.loads(line)["group"]))
            except (ValueError, KeyError, TypeError):
                continue
        return ids
