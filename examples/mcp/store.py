"""The shop behind the example's servers: an inventory in SQLite, with the checks its reward makes.

Plain Python (no MCP import), so the MCP server (store_server.py, mcp 2.x) and the AEnvironment
directory (aenv_store/, whose own virtual environment has mcp 1.x) serve the same shop. Errors a
model can fix are :class:`StoreError` with a sentence saying what to change.
"""

from __future__ import annotations

import json
import sqlite3
from typing import Any

DEFAULT_PRODUCTS = [
    {"sku": "W-1", "name": "widget", "price": 2.5, "stock": 10},
    {"sku": "G-2", "name": "gadget", "price": 12.0, "stock": 4},
    {"sku": "S-3", "name": "sprocket", "price": 0.75, "stock": 120},
]


class StoreError(ValueError):
    """A request the shop refuses (unknown sku, a quantity out of range)."""


class Store:
    """One episode's shop: products and orders in an in-memory SQLite database."""

    def __init__(self, products: list[dict[str, Any]] | None = None) -> None:
        self.database = sqlite3.connect(":memory:", check_same_thread=False)
        self.database.execute(
            "CREATE TABLE products (sku TEXT PRIMARY KEY, name TEXT, price REAL, stock INTEGER)"
        )
        self.database.execute("CREATE TABLE orders (id INTEGER PRIMARY KEY, sku TEXT, quantity INTEGER)")
        self.database.executemany(
            "INSERT INTO products VALUES (:sku, :name, :price, :stock)", products or DEFAULT_PRODUCTS
        )

    def _product(self, sku: str) -> tuple[str, str, float, int]:
        row = self.database.execute(
            "SELECT sku, name, price, stock FROM products WHERE sku = ?", (sku,)
        ).fetchone()
        if row is None:
            skus = [r[0] for r in self.database.execute("SELECT sku FROM products ORDER BY sku")]
            raise StoreError(f"no product with sku {sku!r}; skus: {', '.join(skus)}")
        return row

    def list_products(self) -> str:
        rows = self.database.execute("SELECT sku, name, price, stock FROM products ORDER BY sku").fetchall()
        return json.dumps([{"sku": s, "name": n, "price": p, "stock": q} for s, n, p, q in rows])

    def restock(self, sku: str, quantity: int) -> str:
        if quantity <= 0:
            raise StoreError("quantity must be positive")
        self._product(sku)
        self.database.execute("UPDATE products SET stock = stock + ? WHERE sku = ?", (quantity, sku))
        return f"{sku} now has {self._product(sku)[3]} units in stock"

    def set_price(self, sku: str, price: float) -> str:
        if price <= 0:
            raise StoreError("price must be positive")
        self._product(sku)
        self.database.execute("UPDATE products SET price = ? WHERE sku = ?", (price, sku))
        return f"{sku} now costs {price}"

    def place_order(self, sku: str, quantity: int) -> str:
        stock = self._product(sku)[3]
        if not 0 < quantity <= stock:
            raise StoreError(f"cannot sell {quantity} units of {sku}: {stock} in stock")
        self.database.execute("UPDATE products SET stock = stock - ? WHERE sku = ?", (quantity, sku))
        order = self.database.execute(
            "INSERT INTO orders (sku, quantity) VALUES (?, ?)", (sku, quantity)
        ).lastrowid
        return f"order {order}: {quantity} x {sku}; {stock - quantity} left"

    def check(self, expected: dict[str, Any]) -> dict[str, Any]:
        """The reward: 1.0 when every expected fact holds (``stock``, ``price`` by sku; ``orders`` count)."""
        checks: dict[str, float] = {}
        for sku, stock in (expected.get("stock") or {}).items():
            row = self.database.execute("SELECT stock FROM products WHERE sku = ?", (sku,)).fetchone()
            checks[f"stock:{sku}"] = float(row is not None and row[0] == stock)
        for sku, price in (expected.get("price") or {}).items():
            row = self.database.execute("SELECT price FROM products WHERE sku = ?", (sku,)).fetchone()
            checks[f"price:{sku}"] = float(row is not None and abs(row[0] - price) < 1e-9)
        if "orders" in expected:
            count = self.database.execute("SELECT COUNT(*) FROM orders").fetchone()[0]
            checks["orders"] = float(count == expected["orders"])
        return {"reward": float(all(checks.values())) if checks else 0.0, "breakdown": checks}
