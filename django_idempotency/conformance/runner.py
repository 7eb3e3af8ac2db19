"""One run: every check in order, within the run's cap and deadline, into a report."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import httpx

from django_idempotency.conformance.config import CHECK_NAMES, Config
from django_idempotency.conformance.duplicates import concurrent_duplicates, in_flight
from django_idempotency.conformance.keys import (
    problem_json,
    refused_keys,
    retry_after_on_409,
    safe_method,
)
from django_idempotency.conformance.probe import Probe
from django_idempotency.conformance.replay import key_reused, principal_scoping, replay
from django_idempotency.conformance.report import CheckResult, Report
from django_idempotency.conformance.traffic import BudgetExhausted, EffectCounterError, Sender


def run(
    config: Config,
    *,
    transport: httpx.BaseTransport | None = None,
    clock: Callable[[], float] = time.monotonic,
) -> Report:
    """Check the endpoint of ``config``; return the report (never raises for the endpoint).

    The checks run one after the other, in the order of
    :data:`~django_idempotency.conformance.config.CHECK_NAMES` but the two that
    judge every answer of the run (``retry-after-on-409``, ``problem-json``), which come
    last. A run stopped by its request cap, its time budget or a failing effect counter
    reports what it found so far and the reason in ``Report.error``.

    Args:
        config: the endpoint, its request and the limits.
        transport: an httpx transport (tests: ``httpx.WSGITransport`` or a mock);
            ``None``: the network.
        clock: the run's clock, seconds (default ``time.monotonic``): its deadline and
            the timing of each answer.
    """
    started = clock()
    report = Report(config.url, config.method)
    sender = Sender(config, transport=transport, clock=clock)
    probe = Probe(config, sender)
    try:
        safe_method(probe)
        concurrent_duplicates(probe)
        first = replay(probe)
        principal_scoping(probe, first)
        key_reused(probe, first)
        refused_keys(probe)
        in_flight(probe)
    except BudgetExhausted as exc:
        report.error = str(exc)
    except EffectCounterError as exc:
        report.error = f"the effect counter failed: {exc}"
    finally:
        sender.close()
    retry_after_on_409(probe)
    problem_json(probe)
    exchanges = sender.exchanges
    if exchanges and all(e.status is None for e in exchanges) and not report.error:
        report.error = f"the endpoint never answered: {exchanges[0].error}"
    report.results = _in_order(probe.results, stopped=bool(report.error))
    report.requests_sent = sender.sent
    report.seconds = clock() - started
    return report


def _in_order(results: list[CheckResult], *, stopped: bool) -> list[CheckResult]:
    """One row per check, in the order of ``CHECK_NAMES``; a check not run says why."""
    by_name = {r.name: r for r in results}
    rows = []
    for name in CHECK_NAMES:
        if name in by_name:
            rows.append(by_name[name])
        elif stopped:
            rows.append(CheckResult(name, "", "not run: the run stopped", "skip"))
        elif name.endswith("-effects"):
            rows.append(CheckResult(name, "the effect counter moves by 1", NO_COUNTER, "skip"))
        else:
            rows.append(CheckResult(name, "", "not run", "skip"))
    return rows


#: Why the effect checks did not run.
NO_COUNTER = "no effect counter given (--effect-url or --effect-command)"


class NonConformance(AssertionError):
    """The endpoint broke a promise of the Idempotency-Key protocol; the message is the table.

    Attributes:
        report: the full :class:`~django_idempotency.conformance.report.Report`.
    """

    def __init__(self, report: Report) -> None:
        super().__init__("\n" + report.table())
        self.report = report


def assert_conforms(
    url: str, *, transport: httpx.BaseTransport | None = None, **options: Any
) -> Report:
    """Run the check against ``url`` and fail the test if a check fails.

    For a project's own test suite (pytest or unittest): the options are the fields of
    :class:`~django_idempotency.conformance.config.Config` (``method``, ``body``,
    ``content_type``, ``headers``, ``other_headers``, ``effect_url``, ``concurrency``...);
    ``headers`` and ``other_headers`` may be dicts.

    Returns:
        The report, when every check passed, warned or was skipped.

    Raises:
        NonConformance: a check failed, or the run stopped early; its message is the
            table with what is wrong.
        ConfigError: an option is out of range.
    """
    for name in ("headers", "other_headers"):
        if isinstance(options.get(name), dict):
            options[name] = tuple(options[name].items())
    if isinstance(options.get("skip"), list | tuple | set):
        options["skip"] = frozenset(options["skip"])
    report = run(Config(url=url, **options), transport=transport)
    if not report.passed:
        raise NonConformance(report)
    return report
