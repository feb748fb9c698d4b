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
import sqlite3
from typing import Any

from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ToolError

DEFAULT_PRODUCTS = [
    {"sku": "W-1", "name": "widget", "price": 2.5, "stock": 10},
    {"sku": "G-2", "name": "gadget", "price": 12.0, "stock": 4},
    {"sku": "S-3", "name": "sprocket", "price": 0.75, "stock": 120},
]

app = MCPServer(
    "store", instructions="A shop's inventory: products, stock, prices and orders.", log_level="ERROR"
)
_databases: dict[str, sqlite3.Connection] = {}


def _episode(ctx: Context) -> str:
    meta = ctx.request_context.meta or {}
    episode = (
        meta.get("agentboost/episode")
        if isinstance(meta, dict)
        else getattr(meta, "agentboost/episode", None)
    )
    return str(episode or "default")


def _database(ctx: Context) -> sqlite3.Connection:
    episode = _episode(ctx)
    if episode not in _databases:
        _databases[episode] = _seeded(DEFAULT_PRODUCTS)
    return _databases[episode]


def _seeded(products: list[dict[str, Any]]) -> sqlite3.Connection:
    database = sqlite3.connect(":memory:", check_same_thread=False)
    database.execute("CREATE TABLE products (sku TEXT PRIMARY KEY, name TEXT, price REAL, stock INTEGER)")
    database.execute("CREATE TABLE orders (id INTEGER PRIMARY KEY, sku TEXT, quantity INTEGER)")
    database.executemany("INSERT INTO products VALUES (:sku, :name, :price, :stock)", products)
    return database


def _product(database: sqlite3.Connection, sku: str) -> tuple[str, str, float, int]:
    row = database.execute("SELECT sku, name, price, stock FROM products WHERE sku = ?", (sku,)).fetchone()
    if row is None:
        skus = [r[0] for r in database.execute("SELECT sku FROM products ORDER BY sku")]
        raise ToolError(f"no product with sku {sku!r}; skus: {', '.join(skus)}")
    return row


@app.tool()
def list_products(ctx: Context) -> str:
    """List every product with its sku, name, price and units in stock."""
    rows = _database(ctx).execute("SELECT sku, name, price, stock FROM products ORDER BY sku").fetchall()
    return json.dumps([{"sku": s, "name": n, "price": p, "stock": q} for s, n, p, q in rows])


@app.tool()
def restock(sku: str, quantity: int, ctx: Context) -> str:
    """Add units of a product to the stock.

    Args:
        sku: The product's sku, e.g. W-1.
        quantity: How many units arrive (positive).
    """
    if quantity <= 0:
        raise ToolError("quantity must be positive")
    database = _database(ctx)
    _product(database, sku)
    database.execute("UPDATE products SET stock = stock + ? WHERE sku = ?", (quantity, sku))
    return f"{sku} now has {_product(database, sku)[3]} units in stock"


@app.tool()
def set_price(sku: str, price: float, ctx: Context) -> str:
    """Change the price of a product.

    Args:
        sku: The product's sku, e.g. G-2.
        price: The new price (positive).
    """
    if price <= 0:
        raise ToolError("price must be positive")
    database = _database(ctx)
    _product(database, sku)
    database.execute("UPDATE products SET price = ? WHERE sku = ?", (price, sku))
    return f"{sku} now costs {price}"


@app.tool()
def place_order(sku: str, quantity: int, ctx: Context) -> str:
    """Sell units of a product: records an order and takes the units out of stock.

    Args:
        sku: The product's sku, e.g. S-3.
        quantity: How many units to sell (positive, at most the stock).
    """
    database = _database(ctx)
    stock = _product(database, sku)[3]
    if not 0 < quantity <= stock:
        raise ToolError(f"cannot sell {quantity} units of {sku}: {stock} in stock")
    database.execute("UPDATE products SET stock = stock - ? WHERE sku = ?", (quantity, sku))
    order = database.execute("INSERT INTO orders (sku, quantity) VALUES (?, ?)", (sku, quantity)).lastrowid
    return f"order {order}: {quantity} x {sku}; {stock - quantity} left"


# --- hidden: the environment's lifecycle and reward ------------------------------------------------


@app.tool()
def start_task(metadata: dict[str, Any], ctx: Context) -> str:
    """(environment only) Give this episode a fresh database seeded from the task's products."""
    _databases[_episode(ctx)] = _seeded(metadata.get("products") or DEFAULT_PRODUCTS)
    return "ready"


@app.tool()
def check_task(metadata: dict[str, Any], ctx: Context) -> str:
    """(environment only) The reward: the share of the task's expected facts the final state meets."""
    database = _database(ctx)
    expected = metadata.get("expected") or {}
    checks: dict[str, float] = {}
    for sku, stock in (expected.get("stock") or {}).items():
        row = database.execute("SELECT stock FROM products WHERE sku = ?", (sku,)).fetchone()
        checks[f"stock:{sku}"] = float(row is not None and row[0] == stock)
    for sku, price in (expected.get("price") or {}).items():
        row = database.execute("SELECT price FROM products WHERE sku = ?", (sku,)).fetchone()
        checks[f"price:{sku}"] = float(row is not None and abs(row[0] - price) < 1e-9)
    if "orders" in expected:
        count = database.execute("SELECT COUNT(*) FROM orders").fetchone()[0]
        checks["orders"] = float(count == expected["orders"])
    reward = float(all(checks.values())) if checks else 0.0
    return json.dumps({"reward": reward, "breakdown": checks})


@app.tool()
def end_task(ctx: Context) -> str:
    """(environment only) Drop this episode's database."""
    _databases.pop(_episode(ctx), None)
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
