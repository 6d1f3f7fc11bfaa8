"""A tiny grocery store as an MCP server (stdio): the tools the MCP agent answers questions with.

The answers are deterministic and exact (whole numbers: units and cents), so a scenario's reference
answer can be checked by code. An unknown item is an MCP tool error naming the items there are, so
an agent can correct itself. Run it with `python -m examples.mcp_agent.server` or by its path; it
speaks MCP on stdin/stdout until stdin closes.
"""

from __future__ import annotations

from dataclasses import dataclass

from mcp.server.fastmcp import FastMCP


@dataclass(frozen=True)
class Item:
    stock: int  # units on the shelf
    price_cents: int  # per unit


# Two-digit stock counts: a small model's rambling is full of 0s and single digits, which would
# match a one-digit reference by chance.
INVENTORY = {
    "apple": Item(stock=12, price_cents=45),
    "banana": Item(stock=30, price_cents=25),
    "pear": Item(stock=17, price_cents=85),
    "orange": Item(stock=23, price_cents=60),
    "lemon": Item(stock=18, price_cents=35),
    "mango": Item(stock=14, price_cents=150),
}

# Warnings only: a line per request on stderr would flood the output of every rollout.
mcp = FastMCP("store", log_level="WARNING")


def lookup(item: str) -> Item:
    """The item of that name; plurals ("apples") and case are forgiven."""
    name = item.strip().lower()
    found = INVENTORY.get(name) or INVENTORY.get(name.removesuffix("s"))
    if found is None:
        raise ValueError(f"unknown item {item!r}; the store sells {', '.join(INVENTORY)}")
    return found


@mcp.tool()
def stock(item: str) -> int:
    """How many units of an item the store has in stock."""
    return lookup(item).stock


@mcp.tool()
def price(item: str) -> int:
    """The price of one unit of an item, in cents."""
    return lookup(item).price_cents


@mcp.tool()
def total_cost(item: str, quantity: int) -> int:
    """What `quantity` units of an item cost together, in cents."""
    return lookup(item).price_cents * quantity


if __name__ == "__main__":
    mcp.run("stdio")
