"""Check, before a run, that a server's log-probabilities are those of the distribution agentboost records.

The convention (:mod:`agentboost.engines.base`): ``log_softmax(logits / T)`` of the sampled token,
taken before top-k / top-p truncation. A vLLM server started with its default ``--logprobs-mode
raw_logprobs`` reports the untempered distribution instead, and nothing in its answers says so: the
stored logprobs are silently wrong at any temperature but 1. So the client asks, once, for the top
log-probabilities of one next token under three settings and compares them:

* ``T = 1``: the values must be log-probabilities (their exponentials sum to at most 1); a server
  that reports logits fails here;
* ``T = 1/2``: every gap between two tokens must be exactly twice the ``T = 1`` gap (temperature
  scaling); an untempered server reports the same gaps;
* ``T = 1`` with ``top_k = 2``: if the two values sum (as probabilities) to 1, the server reports
  log-probabilities *after* truncation, which differ from the convention whenever top-k or top-p
  is set: such a server is only used with ``top_k = 0`` and ``top_p = 1``.

The comparisons use gaps and sums of values the server computes for one prompt, so no sampling
luck, batching or model can make a wrong server pass.
"""

from __future__ import annotations

import math
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass

from agentboost.engines.base import SamplingParams
from agentboost.errors import LogprobsModeError

PROBE_PROMPT = (504, 3260, 314, 1790, 30, 216, 1112, 28)
"""A fixed prompt of ids small enough for any vocabulary (for SmolLM2: a short English question)."""
AGENTBOOST_SERVE = "agentboost serve"
"""The ``server`` fact of ``agentboost serve``, whose engines follow the convention by construction."""
PROBE_TOP = 5
"""How many top log-probabilities each probe request asks for."""
PROBE_TEMPERATURE = 0.5
_TOLERANCE = 0.02
"""How far (relative to the gap) a tempered gap may be from ``gap / T``; bf16 servers stay within it."""
_SUM_SLACK = 1e-3
"""How far above 1 the probabilities of the top tokens may sum (rounding)."""

TopLogprobs = Callable[[float, int], Awaitable[Mapping[int, float]]]
"""``(temperature, top_k) -> {token id: log-probability}`` of the first generated token (top_k 0: off)."""


@dataclass(frozen=True)
class LogprobsFacts:
    """What the probe established about a server's log-probabilities."""

    tempered: bool
    """Log-probabilities follow the sampling temperature (always true once the probe passed)."""
    after_truncation: bool
    """Reported after top-k / top-p filtering (vLLM's ``processed_logprobs``)."""

    def describe(self) -> str:
        return "sampling distribution, " + (
            "after top-k/top-p" if self.after_truncation else "before top-k/top-p"
        )

    def check(self, sampling: SamplingParams, *, server: str) -> None:
        """Refuse ``sampling`` when this server's logprobs would depart from the convention for it."""
        if self.after_truncation and not sampling.greedy and (sampling.top_p < 1 or sampling.top_k > 0):
            raise LogprobsModeError(
                f"{server} reports log-probabilities after top-k/top-p filtering and agentboost records "
                f"them before it, so top_p={sampling.top_p:g}, top_k={sampling.top_k} would store wrong "
                "logprobs; sample with top_p 1 and top_k 0 on this server (--top-p 1)"
            )


async def probe_logprobs(top: TopLogprobs, *, server: str, fix: str) -> LogprobsFacts:
    """Ask ``top`` three times and return the facts, or raise LogprobsModeError naming ``fix``."""
    plain = _finite(await top(1.0, 0))
    hot = _finite(await top(PROBE_TEMPERATURE, 0))
    cut = _finite(await top(1.0, 2))
    if len(plain) < 2 or len(hot) < 2 or len(cut) < 2:
        raise LogprobsModeError(
            f"{server} returned fewer than 2 top log-probabilities to the logprobs probe; "
            f"agentboost cannot check which distribution it reports {fix}"
        )
    if _log_mass(plain) > _SUM_SLACK or _log_mass(hot) > _SUM_SLACK:
        raise LogprobsModeError(
            f"{server} reports values that are not log-probabilities (their probabilities sum above 1: "
            f"logits?) {fix}"
        )
    best = max(plain, key=plain.__getitem__)
    shared = [token for token in plain if token in hot and token != best]
    if best not in hot or not shared:
        raise LogprobsModeError(
            f"{server} ranked tokens differently at temperature {PROBE_TEMPERATURE} and 1; its "
            f"log-probabilities do not follow the sampling temperature {fix}"
        )
    token = max(shared, key=lambda t: plain[best] - plain[t])
    gap = plain[best] - plain[token]
    expected = gap / PROBE_TEMPERATURE
    observed = hot[best] - hot[token]
    if gap <= 0 or abs(observed - expected) > _TOLERANCE * expected:
        untempered = abs(observed - gap) <= _TOLERANCE * max(gap, 1e-6)
        what = "the untempered model's" if untempered else "not the sampling distribution's"
        raise LogprobsModeError(
            f"{server} reports {what} log-probabilities (a gap of {gap:.4f} nats at T=1 is {observed:.4f} at "
            f"T={PROBE_TEMPERATURE}, expected {expected:.4f}), so sampled rollouts would record wrong "
            f"logprobs {fix}"
        )
    # top-2 probabilities that sum to 1: renormalised after the cut (also assumed when the model puts
    # all its mass on two tokens and the probe cannot tell: refusing top-p then is the safe side)
    after = abs(_log_mass(cut)) <= _SUM_SLACK
    return LogprobsFacts(tempered=True, after_truncation=after)


def _log_mass(values: Mapping[int, float]) -> float:
    """log of the summed probabilities of ``values``."""
    top = max(values.values())
    return top + math.log(sum(math.exp(v - top) for v in values.values()))


def _finite(values: Mapping[int, float]) -> dict[int, float]:
    """The entries of a top-logprobs answer that are numbers (vLLM writes filtered-out tokens as -9999)."""
    return {token: value for token, value in values.items() if math.isfinite(value) and value > -1e3}
