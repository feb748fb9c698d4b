"""Adapters to outside systems (veRL, ...). Each lives in its own subpackage and is imported only when used,
so ``import agentboost`` never pulls them in."""
