"""An evaluation's arms: the models the agent is run against, named as `--model` names them.

    base                       the base model the proxy's upstream serves (under an alias of
                               its name, ALIAS@0)
    trained                    the base model's name through the proxy: its alias's adapter,
                               the trainer's newest, where the trainer named it after the base
    policy, policy@8, NAME     an alias, one of its steps or any model the upstream serves
    openai/gpt-4.1             OpenAI's API (key: OPENAI_API_KEY), priced by litellm's table
    NAME@http://host:port/v1   any OpenAI-compatible server (key: --arm-api-key LABEL=KEY)
    LABEL=SPEC                 any of the above, under a name of its own in the report

Every arm's calls are recorded through a proxy, so each rollout is a trajectory in the store like
any other (split `eval`): an arm on the proxy's upstream goes through the proxy the command is
given; an arm with a server of its own through a recording proxy the command starts in front of
it, on the same store. `openai/` is the one litellm provider taken by name, because its API is the
one the proxy forwards; another provider is reached through its OpenAI-compatible URL (or a
LiteLLM proxy's).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from art_proxy.errors import ConfigError
from art_proxy.privacy.redaction import redact_url

OPENAI_API = "https://api.openai.com/v1"
BASE = "base"
TRAINED = "trained"
_LABEL = re.compile(r"^[A-Za-z0-9_.:-]+$")
_SERVED_AT = re.compile(r"@(?=https?://)")


@dataclass(frozen=True)
class ArmSpec:
    label: str
    model: str  # the model the agent's calls name ("base": resolved from the upstream)
    upstream: str | None = None  # None: the proxy's own; else the arm's OpenAI-compatible URL
    key_variable: str | None = None  # the environment variable holding the upstream's key
    priced_as: str | None = None  # the model's name in litellm's price table

    @property
    def own_server(self) -> bool:
        return self.upstream is not None


def parse_arm(text: str) -> ArmSpec:
    """The arm `text` names (module docstring); `ConfigError` with the forms when it is none."""
    label, equals, spec = text.partition("=")
    if not equals:
        label, spec = "", text
    elif not _LABEL.match(label):
        raise ConfigError(f"--model {text!r}: the label before '=' may hold letters, digits, _.:-")
    spec = spec.strip()
    if not spec:
        raise ConfigError(f"--model {text!r} names no model (base, ALIAS, openai/NAME, NAME@URL)")
    if spec.startswith("openai/"):
        name = spec.removeprefix("openai/")
        return ArmSpec(label or spec, name, OPENAI_API, "OPENAI_API_KEY", name)
    served_at = _SERVED_AT.search(spec)  # the first '@' a URL follows: a URL may hold '@'
    if served_at is not None:
        name, url = spec[: served_at.start()], spec[served_at.end() :]
        if not name:
            raise ConfigError(f"--model {text!r}: NAME@URL needs the model's name before '@'")
        if redact_url(url) != url:
            # The URL is shown in the report and stored with every trajectory.
            raise ConfigError(
                f"--model '{name}@{redact_url(url)}' carries credentials in its URL: pass the key "
                "with --arm-api-key LABEL=KEY"
            )
        return ArmSpec(label or name, name, url.rstrip("/"))
    return ArmSpec(label or spec, spec)


def parse_arms(texts: list[str]) -> list[ArmSpec]:
    arms = [parse_arm(text) for text in texts]
    labels = [arm.label for arm in arms]
    repeated = sorted({label for label in labels if labels.count(label) > 1})
    if repeated:
        raise ConfigError(
            f"two arms are named {repeated[0]!r}: give each a label (--model LABEL=SPEC)"
        )
    if not arms:
        raise ConfigError("no arm to evaluate: give --model at least once (e.g. --model base)")
    return arms


def base_model(models: list[dict[str, object]]) -> str:
    """The base model among an upstream's `/v1/models` entries (through the proxy): the one
    that is neither an adapter (it has a parent) nor an alias (the proxy owns it)."""
    bases = [
        str(entry["id"])
        for entry in models
        if not entry.get("parent") and entry.get("owned_by") != "art-proxy" and "id" in entry
    ]
    if len(bases) != 1:
        raise ConfigError(
            f"--model base: the upstream serves {len(bases)} base models "
            f"({', '.join(bases) or 'none'}): name the one to evaluate"
        )
    return bases[0]
