"""What every record is: frozen, and strict about names (a field it does not know is an error)."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict

JsonObject = dict[str, Any]


class Record(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
