"""Prefix cache for the embedded engine: the KV of token prefixes it has already read, in a radix tree.

An agent's turn k prompt is turn k-1's prompt, what the model generated and a tool result; the samples
of a GRPO group share their whole prompt. :class:`PrefixCache` keeps the keys and values the model
computed for finished sequences, keyed by their token ids, so a new prompt only prefills what follows
its longest cached prefix.

- **Token-level matching.** A radix tree: every edge holds a run of token ids and their KV
  (``[layers, 2, kv_heads, tokens, head_dim]``). A match may end inside an edge; any prefix length is
  reusable, not only whole blocks.
- **Bounded memory.** ``budget_bytes`` caps the KV held. When an insertion would pass it, the least
  recently used leaves go first (an inner edge becomes a leaf once its children are gone). Nothing is
  in use between scheduler steps (a prefill copies what it matched), so every entry can be evicted.
- **Never stale.** The engine clears the tree whenever the model's weights change
  (:meth:`~agentboost.engines.embedded.engine.LocalEngine.weights_updated`, or an automatic check of the
  parameters' version counters), and never inserts KV computed under older weights.

The cache holds tensors on the model's device; it is used only from the engine's scheduler thread.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch


@dataclass
class PrefixCacheStats:
    """Counters since the engine started (or since the last :meth:`PrefixCache.reset_counters`)."""

    prompt_tokens: int = 0
    """Prompt tokens of every request served."""
    cached_tokens: int = 0
    """Prompt tokens whose KV came from the cache."""
    computed_tokens: int = 0
    """Prompt tokens the model actually prefilled (shared prefixes prefilled once count once)."""
    evicted_tokens: int = 0
    invalidations: int = 0
    """How many times the cache was cleared because the weights changed."""
    tokens: int = 0
    """Tokens held now."""
    bytes: int = 0
    """Bytes of KV held now."""
    entries: int = 0
    """Edges (runs of tokens) held now."""
    budget_bytes: int = 0

    @property
    def hit_rate(self) -> float:
        """Fraction of prompt tokens served from the cache (0 when nothing was served)."""
        return self.cached_tokens / self.prompt_tokens if self.prompt_tokens else 0.0

    def hit_rate_since(self, earlier: PrefixCacheStats | None) -> float:
        """The hit rate over the requests served after ``earlier`` was taken."""
        if earlier is None:
            return self.hit_rate
        prompt = self.prompt_tokens - earlier.prompt_tokens
        return (self.cached_tokens - earlier.cached_tokens) / prompt if prompt > 0 else 0.0

    def as_metrics(self, prefix: str = "prefix_cache/") -> dict[str, float]:
        return {
            f"{prefix}hit_rate": self.hit_rate,
            f"{prefix}prompt_tokens": float(self.prompt_tokens),
            f"{prefix}cached_tokens": float(self.cached_tokens),
            f"{prefix}computed_tokens": float(self.computed_tokens),
            f"{prefix}evicted_tokens": float(self.evicted_tokens),
            f"{prefix}invalidations": float(self.invalidations),
            f"{prefix}tokens": float(self.tokens),
            f"{prefix}bytes": float(self.bytes),
        }


@dataclass(eq=False)
class _Node:
    tokens: tuple[int, ...]
    kv: torch.Tensor | None  # [layers, 2, kv_heads, len(tokens), head_dim]; None only for the root
    parent: _Node | None
    children: dict[int, _Node] = field(default_factory=dict)
    last_used: int = 0


def _common_length(edge: tuple[int, ...], tokens: Sequence[int], start: int) -> int:
    limit = min(len(edge), len(tokens) - start)
    length = 0
    while length < limit and edge[length] == tokens[start + length]:
        length += 1
    return length


class PrefixCache:
    """A radix tree from token ids to their KV, with a byte budget and LRU eviction of leaves."""

    def __init__(self, budget_bytes: int) -> None:
        if budget_bytes < 0:
            raise ValueError(f"the prefix cache budget must be >= 0 bytes, got {budget_bytes}")
        self.budget_bytes = budget_bytes
        self._enabled = budget_bytes > 0
        self._root = _Node((), None, None)
        self._clock = itertools.count(1)
        self._tokens = 0
        self._bytes = 0
        self._entries = 0
        self.stats = PrefixCacheStats(budget_bytes=budget_bytes)

    @property
    def enabled(self) -> bool:
        """Created with a budget (a :meth:`resize` to 0 empties the cache but keeps it enabled)."""
        return self._enabled

    # --- lookup ----------------------------------------------------------------------------------

    def match_length(self, tokens: Sequence[int]) -> int:
        """How many leading tokens of ``tokens`` the cache holds (no side effects)."""
        node, position = self._root, 0
        while position < len(tokens):
            child = node.children.get(tokens[position])
            if child is None:
                break
            common = _common_length(child.tokens, tokens, position)
            position += common
            if common < len(child.tokens):
                break
            node = child
        return position

    def match(self, tokens: Sequence[int], limit: int) -> tuple[int, torch.Tensor | None]:
        """The KV of the longest cached prefix of ``tokens``, at most ``limit`` tokens long.

        Returns ``(length, kv)`` with ``kv`` of shape ``[layers, 2, kv_heads, length, head_dim]`` (a new
        tensor: the caller may keep it), or ``(0, None)``. Marks the matched entries as recently used.
        """
        length, pieces = self.match_pieces(tokens, limit)
        if not pieces:
            return 0, None
        return length, torch.cat(pieces, dim=3) if len(pieces) > 1 else pieces[0].clone()

    def match_pieces(self, tokens: Sequence[int], limit: int) -> tuple[int, list[torch.Tensor]]:
        """As :meth:`match`, without a copy: the matched KV as views of the entries, in order (valid
        until the cache next changes; the engine copies them into its batch at once)."""
        pieces: list[torch.Tensor] = []
        node, position = self._root, 0
        now = next(self._clock)
        while position < limit:
            child = node.children.get(tokens[position])
            if child is None:
                break
            common = min(_common_length(child.tokens, tokens, position), limit - position)
            if common == 0:
                break
            child.last_used = now
            assert child.kv is not None
            pieces.append(child.kv if common == len(child.tokens) else child.kv[:, :, :, :common])
            position += common
            if common < len(child.tokens):
                break
            node = child
        return position, pieces

    # --- insertion -------------------------------------------------------------------------------

    def insert(
        self, tokens: Sequence[int], kv: torch.Tensor, offset: int = 0, *, owned: bool = False
    ) -> None:
        """Hold the KV of ``tokens``. ``kv`` covers ``tokens[offset:]`` (the part before is known cached).

        Parts already held are kept as they are. Evicts least recently used leaves to stay within the
        budget; a run that cannot fit at all is held only as far as it fits. ``owned``: ``kv`` is a
        contiguous tensor nobody else holds, kept as it is when all of it is new (no copy).
        """
        if not self.enabled or len(tokens) <= offset:
            return
        now = next(self._clock)
        node, position = self._root, 0
        while position < len(tokens):
            child = node.children.get(tokens[position])
            if child is None:
                break
            common = _common_length(child.tokens, tokens, position)
            child.last_used = now
            if common < len(child.tokens):
                child = self._split(child, common)
            node, position = child, position + common
        if position < offset:  # the caller's view of what is cached is out of date: hold nothing new
            return
        if position >= len(tokens):
            return
        new = kv[:, :, :, position - offset :]
        per_token = new[:, :, :, :1].numel() * new.element_size()
        room = self._make_room(per_token * new.shape[3], keep=node)
        fits = min(new.shape[3], room // per_token) if per_token else 0
        if fits <= 0:
            return
        whole = owned and position == offset and fits == kv.shape[3] and kv.is_contiguous()
        if whole and kv.untyped_storage().nbytes() == kv.numel() * kv.element_size():
            held = kv  # the caller's own copy, kept as it is
        else:
            held = new[:, :, :, :fits].clone()
        leaf = _Node(tuple(tokens[position : position + fits]), held, node)
        leaf.last_used = now
        node.children[leaf.tokens[0]] = leaf
        self._account(leaf, +1)

    def _split(self, node: _Node, at: int) -> _Node:
        """Cut ``node``'s edge after ``at`` tokens; return the new upper part."""
        assert node.kv is not None and node.parent is not None and 0 < at < len(node.tokens)
        upper = _Node(node.tokens[:at], node.kv[:, :, :, :at].clone(), node.parent, last_used=node.last_used)
        node.parent.children[upper.tokens[0]] = upper
        node.tokens, node.kv, node.parent = node.tokens[at:], node.kv[:, :, :, at:].clone(), upper
        upper.children[node.tokens[0]] = node
        self._entries += 1
        self._sync_stats()
        return upper

    # --- memory ----------------------------------------------------------------------------------

    def _account(self, node: _Node, sign: int) -> None:
        assert node.kv is not None
        self._tokens += sign * len(node.tokens)
        self._bytes += sign * node.kv.numel() * node.kv.element_size()
        self._entries += sign
        self._sync_stats()

    def _sync_stats(self) -> None:
        self.stats.tokens, self.stats.bytes, self.stats.entries = self._tokens, self._bytes, self._entries

    def _make_room(self, wanted: int, *, keep: _Node) -> int:
        """Evict LRU leaves (never ``keep`` or its ancestors) until ``wanted`` bytes fit; return the room."""
        if self._bytes + wanted <= self.budget_bytes:
            return wanted
        protected = set()
        walker: _Node | None = keep
        while walker is not None:
            protected.add(id(walker))
            walker = walker.parent
        leaves = [(leaf.last_used, id(leaf), leaf) for leaf in self._leaves() if id(leaf) not in protected]
        heapq.heapify(leaves)
        while leaves and self._bytes + wanted > self.budget_bytes:
            _, _, leaf = heapq.heappop(leaves)
            parent = leaf.parent
            assert parent is not None
            del parent.children[leaf.tokens[0]]
            self.stats.evicted_tokens += len(leaf.tokens)
            self._account(leaf, -1)
            if parent is not self._root and not parent.children and id(parent) not in protected:
                heapq.heappush(leaves, (parent.last_used, id(parent), parent))
        return max(0, self.budget_bytes - self._bytes)

    def _leaves(self) -> list[_Node]:
        leaves, stack = [], list(self._root.children.values())
        while stack:
            node = stack.pop()
            if node.children:
                stack.extend(node.children.values())
            else:
                leaves.append(node)
        return leaves

    def resize(self, budget_bytes: int) -> None:
        """Change the budget (0 keeps nothing), evicting least recently used leaves down to it."""
        self.budget_bytes = self.stats.budget_bytes = max(0, budget_bytes)
        if self._bytes > self.budget_bytes:
            self._make_room(0, keep=self._root)

    def clear(self) -> None:
        """Drop every entry (the weights changed).

        Every node points at its parent and its parent at it: a tree merely let go of is a reference
        cycle, and its KV would stay in memory until Python's cycle collector happened to run (a 16-row
        benchmark's cache, 0.36 GiB, outlived each clear and the process grew by that much a run). The
        tree is unlinked node by node instead, so its tensors go as soon as nothing else holds them.
        """
        stack = [self._root]
        while stack:
            node = stack.pop()
            stack.extend(node.children.values())
            node.children, node.parent, node.kv = {}, None, None
        self._root = _Node((), None, None)
        self._tokens = self._bytes = self._entries = 0
        self._sync_stats()

    def reset_counters(self) -> None:
        self.stats = PrefixCacheStats(budget_bytes=self.budget_bytes)
        self._sync_stats()

    def check_invariants(self) -> None:
        """Recount everything from the tree (tests use it to prove the books are right)."""
        tokens = size = entries = 0
        stack = [(self._root, 0)]
        while stack:
            node, _ = stack.pop()
            for first, child in node.children.items():
                assert child.tokens and child.tokens[0] == first and child.parent is node
                assert child.kv is not None and child.kv.shape[3] == len(child.tokens)
                # no entry is a view that keeps a larger tensor alive behind the books
                assert child.kv.untyped_storage().nbytes() == child.kv.numel() * child.kv.element_size()
                tokens += len(child.tokens)
                size += child.kv.numel() * child.kv.element_size()
                entries += 1
                stack.append((child, 0))
        assert (tokens, size, entries) == (self._tokens, self._bytes, self._entries), (
            (tokens, size, entries),
            (self._tokens, self._bytes, self._entries),
        )
        assert self._bytes <= self.budget_bytes
