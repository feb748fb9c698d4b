"""A real MCP server for the example: a shop's inventory in SQLite, one database per episode.

Written with the ``mcp`` SDK's server class (``MCPServer``, formerly FastMCP). Run it as

    python examples/mcp/store_server.py                       # stdio (one process per episode)
    python examples/mcp/store_server.py --http 127.0.0.1:8765 # streamable HTTP at /mcp (shared)

Every episode gets its own in-memory SQLite database, keyed by the episode id agentboost sends in
each request's ``_meta`` (``agentboost/episode``); a client that sends none shares the ``default``
database. The agent sees ``list_products``, ``restock``, ``set_price`` and ``place_order``; the
environment also calls ``start_task`` (seed the database), ``check_task`` (the reward: does the final
state match the task's expectations?) and ``end_task`` (drop the database), which the agent never sees.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ToolError

sys.path.insert(0, str(Path(__file__).parent))
from store import Store, StoreError

app = MCPServer(
    "store", instructions="A shop's inventory: products, stock, prices and orders.", log_level="ERROR"
)
_stores: dict[str, Store] = {}


def _episode(ctx: Context) -> str:
    meta = ctx.request_context.meta or {}
    return str(meta.get("agentboost/episode") or "default")


def _store(ctx: Context) -> Store:
    return _stores.setdefault(_episode(ctx), Store())


def _run(action, *args: Any) -> str:
    try:
        return action(*args)
    except StoreError as error:
        raise ToolError(str(error)) from None  # the model reads the sentence


@app.tool()
def list_products(ctx: Context) -> str:
    """List every product with its sku, name, price and units in stock."""
    return _store(ctx).list_products()


@app.tool()
def restock(sku: str, quantity: int, ctx: Context) -> str:
    """Add units of a product to the stock.

    Args:
        sku: The product's sku, e.g. W-1.
        quantity: How many units arrive (positive).
    """
    return _run(_store(ctx).restock, sku, quantity)


@app.tool()
def set_price(sku: str, price: float, ctx: Context) -> str:
    """Change the price of a product.

    Args:
        sku: The product's sku, e.g. G-2.
        price: The new price (positive).
    """
    return _run(_store(ctx).set_price, sku, price)


@app.tool()
def place_order(sku: str, quantity: int, ctx: Context) -> str:
    """Sell units of a product: records an order and takes the units out of stock.

    Args:
        sku: The product's sku, e.g. S-3.
        quantity: How many units to sell (positive, at most the stock).
    """
    return _run(_store(ctx).place_order, sku, quantity)


# --- hidden: the environment's lifecycle and reward ------------------------------------------------


@app.tool()
def start_task(metadata: dict[str, Any], ctx: Context) -> str:
    """(environment only) Give this episode a fresh database seeded from the task's products."""
    _stores[_episode(ctx)] = Store(metadata.get("products"))
    return "ready"


@app.tool()
def check_task(metadata: dict[str, Any], ctx: Context) -> str:
    """(environment only) The reward: 1.0 when the final state meets every expected fact of the task."""
    return json.dumps(_store(ctx).check(metadata.get("expected") or {}))


@app.tool()
def end_task(ctx: Context) -> str:
    """(environment only) Drop this episode's database."""
    _stores.pop(_episode(ctx), None)
    return "released"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--http", metavar="HOST:PORT", help="serve streamable HTTP at /mcp instead of stdio")
    args = parser.parse_args()
    if args.http:
        host, _, port = args.http.rpartition(":")
        app.run("streamable-http", host=host or "127.0.0.1", port=int(port))
    else:
        app.run()


if __name__ == "__main__":
    main()
