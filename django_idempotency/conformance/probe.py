"""What the checks of one run share: the sender, the results so far, what they observed."""

from __future__ import annotations

from dataclasses import dataclass, field

from django_idempotency.conformance.config import Config
from django_idempotency.conformance.report import CheckResult, Verdict
from django_idempotency.conformance.traffic import Exchange, Sender


@dataclass
class Probe:
    """The state of a run, passed to every check.

    Attributes:
        config: the run's options.
        sender: the only way a check sends a request.
        results: the rows of the report so far.
        refusals: answers the idempotency layer gave itself (a refused key, a 409, a
            422), for ``problem-json``.
        conflicts: every 409 seen, for ``retry-after-on-409``.
    """

    config: Config
    sender: Sender
    results: list[CheckResult] = field(default_factory=list)
    refusals: list[Exchange] = field(default_factory=list)
    conflicts: list[Exchange] = field(default_factory=list)

    def add(
        self, name: str, expected: str, observed: str, verdict: Verdict, detail: str = ""
    ) -> None:
        """Record the result of the check ``name`` (a skipped check records a skip)."""
        if name in self.config.skip:
            verdict, observed, detail = "skip", "skipped (--skip)", ""
        self.results.append(CheckResult(name, expected, observed, verdict, detail))

    def skip(self, name: str, expected: str, why: str) -> None:
        """Record ``name`` as not run, and why."""
        self.results.append(CheckResult(name, expected, why, "skip"))

    def effects(self) -> float | None:
        """The effect counter's current value (``None`` without one); see :meth:`Sender.effects`."""
        return self.sender.effects()

    def observe(self, exchange: Exchange) -> Exchange:
        """Note a 409 for ``retry-after-on-409``; return the exchange."""
        if exchange.status == 409:
            self.conflicts.append(exchange)
        return exchange


def effect_delta(before: float | None, after: float | None) -> float | None:
    """``after - before``, or ``None`` when effects are not counted."""
    if before is None or after is None:
        return None
    return after - before


def count(value: float) -> str:
    """A count of effects as text: ``"1"``, ``"2.5"``."""
    return f"{value:g}"
