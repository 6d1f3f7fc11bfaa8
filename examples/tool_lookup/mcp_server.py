"""The code-word tool as an MCP server (stdio), for the MCP variant of the tool agent.

The same tool as `agent.lookup_code_word`, served by mcp's FastMCP: the agent loads it through
langchain-mcp-adapters instead of defining it. Run it as a module from the repository root
(`python -m examples.tool_lookup.mcp_server`); it speaks MCP on stdin/stdout until stdin closes.
"""

from __future__ import annotations

from mcp.server.fastmcp import FastMCP

from examples.tool_lookup.codes import code_word

mcp = FastMCP("codes", log_level="WARNING")


@mcp.tool()
def lookup_code_word(city: str) -> str:
    """The code word of a city."""
    return code_word(city)


if __name__ == "__main__":
    mcp.run("stdio")
