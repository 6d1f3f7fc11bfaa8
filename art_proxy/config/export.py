"""`art-proxy export` and `art-proxy scenario-bank`: what the store has recorded, as JSONL."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from art_proxy.config.shared import PiiSettings, StoreSettings
from art_proxy.records import Split


class ExportSettings(StoreSettings, PiiSettings):
    out: str = Field("-", description="File to write to (- = standard output, JSONL only).")
    format: Literal["jsonl", "parquet", "hf", "trl"] = Field(
        "jsonl",
        description="jsonl: a trajectory a line, whole. parquet: a row per sampled choice of each "
        "call (token ids, logprobs, reward, group), for datasets, pandas and other trainers. hf: "
        "the same rows as a Hugging Face dataset directory (datasets.load_from_disk). trl: JSONL "
        "in TRL's conversational format, a row per sampled choice (prompt, completion, tools, "
        "reward, advantage, label), or with --pairs DPO's preference pairs.",
    )
    pairs: bool = Field(
        False,
        description="With --format trl: a preference pair (prompt, chosen, rejected) for each "
        "prompt that trajectories of different rewards in one group sent alike, the best reply "
        "chosen and the worst rejected.",
    )
    kto: bool = Field(
        False,
        description="With --format trl: only the rows KTOTrainer learns from, as it reads them: "
        "prompt, completion and label (desirable: a reward above its group's mean), of answered "
        "calls in groups whose rewards differ.",
    )
    scenario: str | None = Field(None, description="Only this scenario.")
    status: str | None = Field(
        None, description="Only trajectories in this status (open, finished)."
    )
    split: str | None = Field(None, description="Only this split (train, val, prod).")
    user: str | None = Field(None, description="Only this user's trajectories.")
    tenant: str | None = Field(None, description="Only this tenant's trajectories.")

    @model_validator(mode="after")
    def _parquet_to_a_file(self) -> ExportSettings:
        if self.format in ("parquet", "hf") and self.out == "-":
            raise ValueError(f"--format {self.format} writes to disk: pass --out PATH")
        if (self.pairs or self.kto) and self.format != "trl":
            raise ValueError(f"--{'pairs' if self.pairs else 'kto'} is for --format trl")
        if self.pairs and self.kto:
            raise ValueError("--pairs (DPO) and --kto are two formats: pick one")
        return self


class ScenarioBankSettings(StoreSettings):
    """`art-proxy scenario-bank`: the openings of recorded conversations as a scenarios file."""

    out: str = Field("-", description="Scenarios JSONL to write (- = standard output).")
    split: Split = Field("prod", description="Only scenarios with a trajectory of this split.")
    limit: int = Field(0, ge=0, description="At most this many scenarios, newest first (0 = all).")
