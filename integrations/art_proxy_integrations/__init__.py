"""Client-side helpers for agent frameworks, installable without torch or the proxy server.

`headers` builds the `X-Art-*` attribution headers any OpenAI client can send; the LangGraph callback
handler and chat-model factory arrive with the integrations issue.
"""

from art_proxy_integrations.headers import attribution_headers, scenario_base_url

__all__ = ["attribution_headers", "scenario_base_url"]
