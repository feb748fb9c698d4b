"""Held-out means held out: the check every example's prepare step runs on its train and test sets.

Two sets overlap when they share a task id or a problem text (compared case- and whitespace-
insensitively, so a problem copied with other line breaks is still the same problem). A prepare step
refuses overlapping sets with :class:`SplitOverlapError` unless the user asked for them
(``--allow-overlap``), since a "held-out" score measured on training problems reads as generalisation.
"""

from __future__ import annotations

from collections.abc import Iterable

from agentboost.errors import SplitOverlapError


def normalized_text(text: str) -> str:
    """The problem text as compared: lower case, runs of whitespace as one space."""
    return " ".join(text.lower().split())


def split_overlap(
    train: Iterable[tuple[str, str]], test: Iterable[tuple[str, str]]
) -> tuple[list[str], list[str]]:
    """(test ids also in train, test ids whose problem text is also in train); items are (id, text)."""
    train = list(train)
    ids = {task_id for task_id, _ in train}
    texts = {normalized_text(text) for _, text in train}
    test = list(test)
    return (
        [task_id for task_id, _ in test if task_id in ids],
        [task_id for task_id, text in test if normalized_text(text) in texts],
    )


def check_disjoint(
    train: Iterable[tuple[str, str]], test: Iterable[tuple[str, str]], *, allow: bool = False
) -> str | None:
    """Raise SplitOverlapError when the sets share an id or a problem text, unless ``allow``; then
    return the warning to print (None when they are disjoint)."""
    same_id, same_text = split_overlap(train, test)
    if not same_id and not same_text:
        return None
    shared = list(dict.fromkeys([*same_id, *same_text]))
    what = (
        f"{len(shared)} test problems are also training problems ({len(same_id)} by id, "
        f"{len(same_text)} by problem text; e.g. {', '.join(shared[:3])})"
    )
    if not allow:
        raise SplitOverlapError(
            f"{what}: the test set would not be held out; choose disjoint sets, or pass --allow-overlap "
            "to write them anyway"
        )
    return f"warning: {what}; written anyway (--allow-overlap): test scores are not held-out scores"
