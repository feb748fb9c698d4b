"""The example's shop as an AEnvironment environment directory (served by ``python -m aenv.main``).

Tools with ``@register_tool`` (served over MCP at /mcp), a per-episode reset with ``@register_function``
(``POST /functions/start_task``), and the reward with ``@register_reward`` (``POST /task/reward``).
An AEnvironment server process is one instance: agentboost starts one per episode, so the module's
global shop is the episode's shop.
"""

import sys
from pathlib import Path

from aenv import register_function, register_reward, register_tool

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from store import Store

_shop = {"store": Store(), "expected": {}}


@register_tool
def list_products() -> str:
    """List every product with its sku, name, price and units in stock."""
    return _shop["store"].list_products()


@register_tool
def restock(sku: str, quantity: int) -> str:
    """Add units of a product to the stock.

    Args:
        sku: The product's sku, e.g. W-1.
        quantity: How many units arrive (positive).
    """
    return _shop["store"].restock(sku, quantity)


@register_tool
def set_price(sku: str, price: float) -> str:
    """Change the price of a product.

    Args:
        sku: The product's sku, e.g. G-2.
        price: The new price (positive).
    """
    return _shop["store"].set_price(sku, price)


@register_tool
def place_order(sku: str, quantity: int) -> str:
    """Sell units of a product: records an order and takes the units out of stock.

    Args:
        sku: The product's sku, e.g. S-3.
        quantity: How many units to sell (positive, at most the stock).
    """
    return _shop["store"].place_order(sku, quantity)


@register_function
def start_task(task_id: str = "", metadata: dict | None = None) -> dict:
    """Select the task: a fresh shop seeded from its products, and its expectations for the reward."""
    metadata = metadata or {}
    _shop["store"] = Store(metadata.get("products"))
    _shop["expected"] = metadata.get("expected") or {}
    return {"task_id": task_id, "ready": True}


@register_reward
def reward(**_: object) -> dict:
    """1.0 when the shop's final state meets every expectation of the selected task."""
    return _shop["store"].check(_shop["expected"])
