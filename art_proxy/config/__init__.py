"""Typed settings, one module per command. No I/O here: the CLI builds them from flags and
`ART_PROXY_*` variables (cli/options.py), one flag per field.

A field more than one command takes with the same meaning, default and validation is declared
once, in a group the commands' settings inherit (`shared.py`, `JudgeChoice`); a field that only
shares a name (`--group-size`, `--out`, `--poll`...) means something else in each command and is
declared by each.
"""

from art_proxy.config.alias import (
    AliasHistorySettings,
    AliasListSettings,
    AliasResetSettings,
    AliasSetSettings,
)
from art_proxy.config.erasure import ForgetSettings, LineageSettings
from art_proxy.config.evaluate import EvalSettings
from art_proxy.config.export import ExportSettings, ScenarioBankSettings
from art_proxy.config.journal import (
    DropSettings,
    HousekeepingSettings,
    RejectedSettings,
    ReplaySettings,
)
from art_proxy.config.judge import JudgeChoice, JudgeSettings, ProgrammaticFor
from art_proxy.config.proxy import (
    JOURNAL_AUTO,
    JOURNAL_OFF,
    Durability,
    LogLevel,
    OnStoreError,
    ProxySettings,
    RecordPolicy,
    is_loopback,
)
from art_proxy.config.rollout import RolloutSettings
from art_proxy.config.scenario_writer import ScenarioWriterSettings
from art_proxy.config.shared import ARGUMENT, DEFAULT_STORE, StoreSettings, UpstreamSettings
from art_proxy.config.train import RewardSource, TrainSettings
from art_proxy.config.trainer import TrainerConfig
from art_proxy.config.up import Engine, UpSettings

__all__ = [
    "ARGUMENT",
    "DEFAULT_STORE",
    "JOURNAL_AUTO",
    "JOURNAL_OFF",
    "AliasHistorySettings",
    "AliasListSettings",
    "AliasResetSettings",
    "AliasSetSettings",
    "DropSettings",
    "Durability",
    "Engine",
    "EvalSettings",
    "ExportSettings",
    "ForgetSettings",
    "HousekeepingSettings",
    "JudgeChoice",
    "JudgeSettings",
    "LineageSettings",
    "LogLevel",
    "OnStoreError",
    "ProgrammaticFor",
    "ProxySettings",
    "RecordPolicy",
    "RejectedSettings",
    "ReplaySettings",
    "RewardSource",
    "RolloutSettings",
    "ScenarioBankSettings",
    "ScenarioWriterSettings",
    "StoreSettings",
    "TrainSettings",
    "TrainerConfig",
    "UpSettings",
    "UpstreamSettings",
    "is_loopback",
]
