"""The conformance check against small servers over real HTTP: one correct, one per fault.

Each server is a WSGI app on 127.0.0.1 (tests/support/conformance_servers.py). The
correct one passes every check; each broken one fails the check that names its fault,
with a message that says what is wrong, and passes the checks its fault does not touch.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest

from django_idempotency.conformance import Config, Report, run
from tests.support.conformance_servers import KeyedOrders, WSGIApp, serve, strip_header

ALICE = (("Authorization", "Token alice"),)
BOB = (("Authorization", "Token bob"),)


@contextmanager
def checked(app: WSGIApp, **options: Any) -> Iterator[Report]:
    """Run the check against ``app`` served on 127.0.0.1; yields the report."""
    options = {
        "body": b'{"item": "widget", "quantity": 2}',
        "content_type": "application/json",
        "headers": ALICE,
        "other_headers": BOB,
        "concurrency": 8,
        "replay_delay": 0.0,
        "in_flight_delay": 0.05,
        **options,
    }
    with serve(app) as base:
        effect = {"effect_url": f"{base}/count", "effect_field": "count"}
        slow = {"slow_query": "slow=1"}
        yield run(Config(url=f"{base}/orders", **{**effect, **slow, **options}))


def failed(report: Report) -> set[str]:
    return {r.name for r in report.failures}


def test_a_conforming_endpoint_passes_every_check() -> None:
    with checked(KeyedOrders()) as report:
        pass

    assert report.passed, report.table()
    assert report.exit_code() == 0
    assert {r.verdict for r in report.results} == {"pass"}, report.table()
    assert report.result("concurrent-effects").observed == "moved by 1"
    assert report.result("in-flight").observed.startswith("duplicate 409 [request-in-flight]")


def test_a_cache_then_execute_middleware_is_caught_running_duplicates_twice() -> None:
    with checked(KeyedOrders("cache_then_execute"), skip=frozenset({"in-flight"})) as report:
        pass

    assert failed(report) == {"concurrent-duplicates", "concurrent-effects"}, report.table()
    duplicates = report.result("concurrent-duplicates")
    assert "answered as first executions" in duplicates.detail
    assert "the request ran more than once" in duplicates.detail
    assert "claimed atomically before the handler runs" in duplicates.detail
    assert report.result("concurrent-effects").detail.startswith(
        "8 concurrent duplicates with one key took effect"
    )
    assert report.exit_code() == 1


def test_replaying_another_principals_answer_is_caught() -> None:
    with checked(KeyedOrders("shared_across_principals")) as report:
        pass

    assert failed(report) == {"principal-scoping"}, report.table()
    scoping = report.result("principal-scoping")
    assert "marked replayed" in scoping.observed
    assert "second principal got the first principal's stored answer" in scoping.detail


def test_a_second_principal_is_not_checked_without_its_credentials() -> None:
    with checked(KeyedOrders("shared_across_principals"), other_headers=()) as report:
        pass

    assert report.result("principal-scoping").verdict == "skip"
    assert report.result("principal-scoping").observed == "no second principal given"


def test_a_replay_without_the_bodys_media_type_is_caught() -> None:
    with checked(KeyedOrders("replay_drops_media_type")) as report:
        pass

    assert failed(report) == {"replay-headers"}, report.table()
    headers = report.result("replay-headers")
    assert headers.observed == "Content-Type: 'application/json' then '(absent)'"
    assert "does not describe its body as the first answer did (Content-Type)" in headers.detail


def test_a_500_for_a_bad_key_is_caught() -> None:
    with checked(KeyedOrders("crash_on_bad_key")) as report:
        pass

    bad_keys = {"key-empty", "key-too-long", "key-non-ascii", "key-two-lines"}
    assert failed(report) == bad_keys, report.table()
    for name in bad_keys:
        result = report.result(name)
        assert result.observed == "500"
        assert "a client mistake answered as a server error" in result.detail
    assert report.result("key-missing").verdict == "pass"


def test_a_proxy_that_strips_the_header_is_caught() -> None:
    with checked(strip_header(KeyedOrders()), skip=frozenset({"in-flight"})) as report:
        pass

    assert "concurrent-duplicates" in failed(report), report.table()
    detail = report.result("concurrent-duplicates").detail
    assert detail.startswith("every request was refused (400 [missing-key] x 8)")
    assert "the Idempotency-Key header does not reach the application" in detail
    assert "strips it" in detail
    assert report.result("replay-marker").verdict == "fail"
    assert "The first answer was 400 [missing-key], a refusal" in (
        report.result("replay-marker").detail
    )


def test_a_duplicate_held_until_the_original_finishes_is_caught() -> None:
    with checked(KeyedOrders("blocks_duplicates")) as report:
        pass

    assert failed(report) == {"in-flight"}, report.table()
    assert "held until the original finished" in report.result("in-flight").detail
    assert "a blocked connection" in report.result("in-flight").detail


def test_an_endpoint_whose_handler_is_not_slow_leaves_in_flight_inconclusive() -> None:
    with checked(strip_header(KeyedOrders()), skip=frozenset()) as report:
        pass

    in_flight = report.result("in-flight")
    assert in_flight.verdict == "warn"
    assert "before the duplicate was sent" in in_flight.observed
    assert "inconclusive" in in_flight.detail


def test_without_an_effect_counter_the_effect_checks_are_not_run() -> None:
    with serve(KeyedOrders()) as base:
        report = run(
            Config(
                url=f"{base}/orders",
                body=b"{}",
                content_type="application/json",
                headers=ALICE,
                concurrency=4,
                replay_delay=0.0,
            )
        )

    assert report.passed, report.table()
    assert report.result("concurrent-effects").verdict == "skip"
    assert report.result("replay-effects").verdict == "skip"
    assert report.result("in-flight").verdict == "skip"


def test_an_optional_key_endpoint_is_not_sent_an_unkeyed_request() -> None:
    app = KeyedOrders()
    with checked(app, key_required=False, skip=frozenset({"in-flight"})) as report:
        pass

    assert report.result("key-missing").verdict == "skip"
    assert "optional" in report.result("key-missing").observed
    assert report.passed, report.table()


@pytest.mark.parametrize("fault", ["", "crash_on_bad_key"])
def test_the_run_sends_the_requests_it_plans(fault: str) -> None:
    with checked(KeyedOrders(*filter(None, [fault]))) as report:
        pass

    config_plan = Config(
        url="http://127.0.0.1/orders",
        headers=ALICE,
        other_headers=BOB,
        concurrency=8,
        effect_url="http://127.0.0.1/count",
        slow_query="slow=1",
    ).planned_requests()
    assert report.requests_sent == config_plan == 8 + 2 + (2 + 2) + 1 + (1 + 2) + 5 * 3 + 4 + 2


@pytest.mark.parametrize(
    ("fault", "caught_by", "says"),
    [
        ("ignores_body", {"key-reused"}, "the first request's answer was replayed to a different"),
        ("replays_cookies", {"replay-per-exchange"}, "repeats the first exchange's Set-Cookie"),
        ("no_retry_after", {"retry-after-on-409"}, "without a usable Retry-After"),
        ("plain_json_errors", {"problem-json"}, "key-empty (400), key-missing (400)"),
        ("keys_on_safe_methods", {"safe-method"}, "the key must be ignored on safe methods"),
    ],
)
def test_each_other_broken_promise_is_caught_by_its_check(
    fault: str, caught_by: set[str], says: str
) -> None:
    with checked(KeyedOrders(fault)) as report:
        pass

    assert failed(report) == caught_by, report.table()
    check = next(iter(caught_by))
    assert says in report.result(check).detail
    assert f"FAIL {check}: " in report.table()


def test_a_server_error_among_duplicates_of_one_execution_is_a_warning() -> None:
    with checked(KeyedOrders("crash_one_duplicate")) as report:
        pass

    duplicates = report.result("concurrent-duplicates")
    assert duplicates.verdict == "warn", report.table()
    assert "1 errors (500)" in duplicates.observed
    assert "1 of 8 duplicates got a server error or no answer (500)" in duplicates.detail
    assert "still ran once (one first answer, and the effect counter moved by 1)" in (
        duplicates.detail
    )
    assert report.passed and report.exit_code() == 0, report.table()


def test_a_replayed_date_is_caught_a_second_later() -> None:
    with checked(KeyedOrders("replays_date"), replay_delay=1.0) as report:
        pass

    assert failed(report) == {"replay-per-exchange"}, report.table()
    assert report.result("replay-per-exchange").observed == "repeated: Date"
    assert "the moment" in report.result("replay-per-exchange").detail


def test_a_date_is_not_judged_within_one_second() -> None:
    with checked(KeyedOrders("replays_date"), replay_delay=0.0) as report:
        pass

    assert report.result("replay-per-exchange").verdict == "skip", report.table()


def test_unmarked_replays_of_one_execution_are_told_apart_from_executions() -> None:
    with checked(KeyedOrders("no_replay_marker")) as report:
        pass

    assert failed(report) == {"concurrent-duplicates", "replay-marker"}, report.table()
    detail = report.result("concurrent-duplicates").detail
    assert "the effect counter moved by 1, so the request ran once" in detail
    assert "the replays lack Idempotent-Replayed: true" in detail
    assert "does not say it is a replay" in report.result("replay-marker").detail
    assert report.result("concurrent-effects").verdict == "pass"


def test_a_key_over_the_given_limit_that_the_endpoint_accepts_is_reported_with_the_fix() -> None:
    with checked(KeyedOrders(), max_key_length=100) as report:
        pass

    assert failed(report) == {"key-too-long"}, report.table()
    result = report.result("key-too-long")
    assert result.observed == "201; effects +1"
    assert result.detail == (
        "a request with a key of 101 characters (the limit: 100) was executed (1 effects). "
        "If the endpoint's limit is higher, say so with --max-key-length."
    )
