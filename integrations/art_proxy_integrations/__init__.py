"""Client-side helpers for agent frameworks, installable without torch or the proxy server.

`headers` builds the `X-Art-*` attribution headers any OpenAI client can send; `langgraph` holds the
LangChain callback handler and chat-model factory (extra `[langgraph]`, imported on its own so this
package needs no LangChain).
"""

from art_proxy_integrations.headers import attribution_headers, scenario_base_url

__all__ = ["attribution_headers", "scenario_base_url"]
