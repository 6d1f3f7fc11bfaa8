"""`art-proxy serve`: the recording proxy in front of the upstream(s)."""

from __future__ import annotations

import ipaddress
from enum import StrEnum

from pydantic import Field, model_validator

from art_proxy.config.shared import PiiSettings, Settings, StoreSettings, UpstreamSettings
from art_proxy.records import ScenarioSplit


class OnStoreError(StrEnum):
    serve = "serve"
    fail = "fail"


class RecordPolicy(StrEnum):
    """Which calls the proxy records (a call it does not record is forwarded and answered alike)."""

    all = "all"  # every call, except one that says `X-Art-Record: off`
    consented = "consented"  # only a call that says `X-Art-Record: on`
    none = "none"  # no call: a plain relay


class Durability(StrEnum):
    process = "process"  # a journaled record survives the process being killed (page cache)
    power = "power"  # ... and the machine losing power (a group-committed fdatasync)


JOURNAL_AUTO, JOURNAL_OFF = "auto", "off"


class LogLevel(StrEnum):
    debug = "debug"
    info = "info"
    warning = "warning"
    error = "error"


class JournalSettings(Settings):
    """Where a proxy keeps each record before the store has it (`serve`, and `up`'s proxy)."""

    journal: str = Field(
        JOURNAL_AUTO,
        description="Directory where each call's record is appended before the answer is sent; "
        "an ingester moves records into the store, so calls go on being answered and recorded "
        "while the store is down. auto: STORE.journal beside a SQLite store, else under "
        "$XDG_STATE_HOME/art-proxy/journals; off: each answer waits for the store's commit.",
    )
    durability: Durability = Field(
        Durability.process,
        description="process: a record the client saw answered survives the proxy being killed; "
        "power: also the machine losing power (an fdatasync before the answer).",
    )
    journal_max_mb: float = Field(
        0.0,
        ge=0,
        description="Most MiB of records the journal keeps waiting for the store (a long outage); "
        "past it a record is committed to the store directly, then --on-store-error applies "
        "(0 = as much as the disk holds).",
    )
    drain_timeout: float = Field(
        10.0,
        ge=0,
        description="Seconds a stopping proxy goes on moving its journal into the store; what is "
        "left waits in the journal for the next proxy started on the same directory. Keep it "
        "inside the grace period the proxy is stopped with (Kubernetes' "
        "terminationGracePeriodSeconds, compose's stop_grace_period).",
    )


class ProxySettings(JournalSettings, UpstreamSettings, StoreSettings, PiiSettings):
    host: str = Field("127.0.0.1", description="Address to bind.")
    port: int = Field(8100, description="Port to bind (0 = any free port).")
    api_key: str | None = Field(None, description="Key clients must send as Bearer (unset = open).")
    admin_key: str | None = Field(
        None,
        description="Key the /art/ endpoints and the dashboard require (unset: they answer "
        "clients on this machine only, unless --open-admin).",
    )
    idle_timeout: float = Field(
        300.0, description="Seconds without a call after which a trajectory finishes (0 = never)."
    )
    group_size: int = Field(
        0, description="Trajectories per group; a full group starts a new one (0 = unlimited)."
    )
    upstream_timeout: float = Field(
        600.0, description="Seconds to wait for the upstream (504 after)."
    )
    max_body_mb: float = Field(32.0, description="Largest request body in MiB (413 above).")
    on_store_error: OnStoreError = Field(
        OnStoreError.serve,
        description="When a record can be neither journaled (a full disk) nor committed: serve: "
        "answer the agent and count the lost record; fail: answer 503.",
    )
    record: RecordPolicy = Field(
        RecordPolicy.all,
        description="Which calls are recorded: all (but those sent with X-Art-Record: off), "
        "consented (only those sent with X-Art-Record: on) or none. An unrecorded call is "
        "forwarded and answered as any other, and nothing of it is kept or logged.",
    )
    retain_days: float = Field(
        0.0,
        ge=0,
        description="Delete trajectories (calls, feedback, judgments, openings) started more than "
        "this many days ago, every 10 minutes in small batches (0 = keep them).",
    )
    default_split: ScenarioSplit = Field(
        "train",
        description="Split of the calls that name none by X-Art-Split (prod: an unmodified "
        "production agent's traffic).",
    )
    log_level: LogLevel = Field(
        LogLevel.info,
        description="debug: a line per call (route, status, trajectory, how it was attributed "
        "and why); refused requests, 404s and upstream errors are logged at warning.",
    )
    shadow_fraction: float = Field(
        0.0,
        ge=0,
        le=1,
        description="Share of prod calls that open a conversation and answer without tool calls "
        "that are sampled again after the answer was sent, as siblings in their group "
        "(0 = off, 1 = every one).",
    )
    shadow_samples: int = Field(
        3, ge=1, description="Extra samples of each shadowed call, each its own trajectory."
    )
    allowed_hosts: list[str] = Field(
        default_factory=list,
        description="Host names /art/ and the dashboard answer to without --admin-key, besides "
        "loopback names and --host (a page that rebinds its own name to this address is "
        "refused); * = any.",
    )
    open_admin: bool = Field(
        False,
        description="Serve /art/ and the dashboard without --admin-key to clients beyond this "
        "machine (without it they answer loopback clients only: /art/ reads every trajectory "
        "and can redirect every agent's model), and bind beyond loopback with --api-key alone.",
    )
    shadow_max_in_flight: int = Field(
        8,
        ge=1,
        description="Shadowed calls whose samples may run at once; beyond it a call is not "
        "shadowed (counted as shadow_skipped on /health).",
    )

    best_of: int = Field(
        4,
        ge=2,
        le=16,
        description="Candidates of a call --best-of-fraction draws (X-Art-Best-Of: N sets a "
        "call's own).",
    )
    best_of_fraction: float = Field(
        0.0,
        ge=0,
        le=1,
        description="Share of prod calls that open a conversation answered best-of-N: --best-of "
        "answers sampled, the best one answered, all of them recorded as one judged group "
        "(0 = only calls that send X-Art-Best-Of).",
    )
    best_of_check: str | None = Field(
        None,
        description="Choose among best-of candidates with this function (module:function or "
        "file.py:function): given the call's messages and one candidate ({message, "
        "finish_reason}), it returns the candidate's score in [0, 1], sync or async.",
    )
    best_of_judge: str | None = Field(
        None,
        description="Choose among best-of candidates with RULER, this judge (any litellm model "
        "name, a local one included).",
    )
    best_of_judge_base_url: str | None = Field(
        None, description="The --best-of-judge's OpenAI-compatible base URL (a self-hosted judge)."
    )
    best_of_timeout: float = Field(
        10.0,
        gt=0,
        description="Seconds the best-of chooser may take; then the first candidate is answered "
        "and the group recorded unjudged.",
    )

    @model_validator(mode="after")
    def _one_chooser(self) -> ProxySettings:
        if self.best_of_check and self.best_of_judge:
            raise ValueError("pass --best-of-check or --best-of-judge, not both")
        if self.best_of_fraction and not (self.best_of_check or self.best_of_judge):
            raise ValueError(
                "--best-of-fraction needs a chooser: --best-of-check or --best-of-judge"
            )
        return self

    @model_validator(mode="after")
    def _admin_not_left_open(self) -> ProxySettings:
        exposed = not is_loopback(self.host)
        if self.api_key and not self.admin_key and exposed and not self.open_admin:
            raise ValueError(
                f"--api-key without --admin-key leaves /art/ and the dashboard open on "
                f"{self.host}, beyond loopback (anyone could move a model alias): set "
                "--admin-key, or --open-admin to serve them open anyway"
            )
        return self


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False
