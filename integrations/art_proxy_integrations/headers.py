"""Attribution for any OpenAI client: `X-Art-*` headers or a per-run base URL.

These mirror the proxy's contract (strongest first): a base URL
`{proxy}/scenario/{scenario}[/trajectory/{trajectory}]/v1`, then the headers `X-Art-Scenario`,
`X-Art-Trajectory` and `X-Art-Split`.
"""

from __future__ import annotations

from typing import Literal
from urllib.parse import quote

# As the proxy reads X-Art-Split (art_proxy.records.Split): eval is `art-proxy eval`'s, apart.
Split = Literal["train", "val", "prod", "eval"]


def attribution_headers(
    scenario: str | None = None, trajectory: str | None = None, split: Split | None = None
) -> dict[str, str]:
    """Headers to pass as `default_headers=` (OpenAI SDK) or `extra_headers=` per call."""
    headers: dict[str, str] = {}
    if scenario is not None:
        headers["X-Art-Scenario"] = scenario
    if trajectory is not None:
        headers["X-Art-Trajectory"] = trajectory
    if split is not None:
        headers["X-Art-Split"] = split
    return headers


def scenario_base_url(proxy_url: str, scenario: str, trajectory: str | None = None) -> str:
    """`http://proxy:8100` -> `http://proxy:8100/scenario/<scenario>[/trajectory/<id>]/v1`."""
    root = proxy_url.rstrip("/").removesuffix("/v1")
    url = f"{root}/scenario/{quote(scenario, safe='')}"
    if trajectory is not None:
        url += f"/trajectory/{quote(trajectory, safe='')}"
    return url + "/v1"
