"""The settings base and the field groups more than one command takes, each field declared once.

A command's settings inherit the groups it takes. Pydantic lists inherited fields from the last
base to the first, then the model's own, and the CLI offers the flags in that order.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, field_validator
from pydantic.config import JsonDict
from sqlalchemy.engine import make_url
from sqlalchemy.exc import ArgumentError

from art_proxy.privacy.redaction import redact_url

DEFAULT_STORE = "sqlite:///art.db"
# `json_schema_extra` of a field that is a positional argument of its command, not a --flag.
ARGUMENT: JsonDict = {"argument": True}


class Settings(BaseModel):
    """Typed, frozen, and strict about names: a misspelt field is an error, never ignored."""

    model_config = ConfigDict(extra="forbid", frozen=True)


class StoreSettings(Settings):
    store: str = Field(
        DEFAULT_STORE,
        description="Store URL: sqlite:///FILE (default) or postgresql+asyncpg://USER@HOST/DB.",
    )

    @field_validator("store")
    @classmethod
    def _store_is_a_database_url(cls, url: str) -> str:
        # `postgres://` is what Heroku, Render and libpq hand out; SQLAlchemy 1.4 dropped the name.
        if url.startswith(("postgres://", "postgres+")):
            url = "postgresql" + url.removeprefix("postgres")
        try:
            backend = make_url(url).get_backend_name()
        except ArgumentError:
            backend = None
        if backend not in ("sqlite", "postgresql"):
            raise ValueError(
                f"store {redact_url(url)!r} is not a SQLite or PostgreSQL URL: {_sqlite_hint(url)} "
                "for a SQLite file, postgresql+asyncpg://USER@HOST/DB for PostgreSQL"
            )
        return url


def _sqlite_hint(url: str) -> str:
    """The SQLite URL a malformed store most likely meant: `art.db` and `sqlite:/art.db` (one
    slash) both mean `sqlite:///art.db`."""
    if "://" in url:
        return "sqlite:///FILE"
    return "sqlite:///" + url.removeprefix("sqlite:").lstrip("/")


class UpstreamSettings(Settings):
    """The inference servers: the proxy forwards calls to them, the trainer loads adapters into
    every one."""

    upstream: list[str] = Field(
        default_factory=lambda: ["http://127.0.0.1:8000/v1"],
        description="Inference server base URL, ending in /v1; repeat for several replicas.",
    )
    upstream_api_key: str | None = Field(
        None, description="Bearer key sent to the upstream (never stored or logged)."
    )

    @field_validator("upstream")
    @classmethod
    def _upstreams_are_base_urls(cls, urls: list[str]) -> list[str]:
        if not urls:
            raise ValueError("at least one --upstream is needed")
        for url in urls:
            if not url.startswith(("http://", "https://")):
                raise ValueError(f"upstream {redact_url(url)!r} is not an http(s) URL")
            if redact_url(url) != url:
                # The URL is logged, shown on /health and stored with every trajectory.
                raise ValueError(
                    f"upstream {redact_url(url)!r} carries credentials in its URL, where they "
                    "would be logged, shown and stored: pass the key with --upstream-api-key "
                    "instead"
                )
        return [url.rstrip("/") for url in urls]


# The experiment trackers `--report-to` logs to.
TRACKERS = ("tensorboard", "wandb", "mlflow")


class PiiSettings(Settings):
    """Personal data kept out of what a command shows or sends on (art_proxy/privacy/pii.py)."""

    redact_pii: bool = Field(
        False,
        description="Replace personal data (e-mail addresses, phone, card, IBAN and account "
        "numbers, IP addresses; names with --pii-spacy-model) with placeholders in what is "
        "shown or sent on; the training token ids are never altered. Needs art-proxy[pii].",
    )
    pii_spacy_model: str | None = Field(
        None,
        description="An installed spaCy model (en_core_web_lg) to find names, places and "
        "groups too; without one, only the pattern recognisers run.",
    )


class ReportSettings(Settings):
    """Where a command's figures go besides its own output."""

    tensorboard: str | None = Field(
        None, description="Also write metrics for TensorBoard into this directory."
    )
    report_to: list[str] = Field(
        default_factory=list,
        description="Also log metrics to these experiment trackers (repeat, or comma-separated): "
        "tensorboard (into --tensorboard, else a directory beside the output), wandb "
        "(WANDB_PROJECT, WANDB_MODE=offline...), mlflow (MLFLOW_TRACKING_URI, "
        "MLFLOW_EXPERIMENT_NAME).",
    )

    @field_validator("report_to")
    @classmethod
    def _known_trackers(cls, names: list[str]) -> list[str]:
        trackers = [name.strip() for value in names for name in value.split(",") if name.strip()]
        unknown = [name for name in trackers if name not in TRACKERS]
        if unknown:
            raise ValueError(f"{unknown[0]!r} is not one of {', '.join(TRACKERS)}")
        return list(dict.fromkeys(trackers))
