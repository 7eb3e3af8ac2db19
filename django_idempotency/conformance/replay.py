"""A retry after the answer: the replay's fidelity, its scope (principal), and another body."""

from __future__ import annotations

import email.utils
import time

from django_idempotency.conformance.probe import Probe, count, effect_delta
from django_idempotency.conformance.report import Verdict
from django_idempotency.conformance.traffic import Exchange, new_key

#: Headers that describe the representation or the resource: a replay keeps them.
REPRESENTATION_HEADERS = (
    "Content-Type",
    "Content-Encoding",
    "Content-Language",
    "Content-Location",
    "Content-Disposition",
    "Location",
    "ETag",
    "Last-Modified",
)
#: Tracing and correlation ids: they name one request, a replay never repeats them.
TRACING_HEADERS = (
    "traceparent",
    "tracestate",
    "X-Request-Id",
    "X-Correlation-Id",
    "Request-Id",
    "Correlation-Id",
    "X-Amzn-Trace-Id",
    "X-Amzn-RequestId",
    "X-Amz-Request-Id",
    "X-Cloud-Trace-Context",
    "X-B3-TraceId",
    "b3",
    "uber-trace-id",
    "sentry-trace",
    "X-Trace-Id",
)


def replay(probe: Probe) -> tuple[Exchange, str] | None:
    """The ``replay-*`` checks: the same request twice, one key, one after the other.

    Returns the first answer and its key, for the checks that send the key again, or
    ``None`` when there was no first answer to compare against.
    """
    config = probe.config
    key = new_key()
    before = probe.effects()
    first = probe.observe(probe.sender.send("replay #1", key=key))
    if first.status is None or first.status >= 500 or first.status == 409 or first.replayed:
        why = f"no first answer to replay: the request got {first.summary()}"
        for name in ("replay-status", "replay-body", "replay-headers", "replay-marker"):
            probe.add(name, "as the first answer", why, "fail", why + ".")
        probe.skip("replay-per-exchange", "not the first answer's", why)
        if config.runs("replay-effects"):
            probe.skip("replay-effects", "the effect counter moves by 1", why)
        return None
    if first.headers.get("Date"):  # a second apart, so a replayed Date shows
        time.sleep(config.replay_delay)
    second = probe.observe(probe.sender.send("replay #2", key=key))
    after = probe.effects()
    same = "the first answer's"
    probe.add(
        "replay-status",
        f"{first.status}, {same}",
        str(second.summary()),
        "pass" if second.status == first.status else "fail",
        "" if second.status == first.status else "a retry must get the first answer's status.",
    )
    probe.add("replay-body", f"{len(first.body)} bytes, {same}", *_compare_body(first, second))
    headers = _compare_headers(first, second)
    probe.add("replay-headers", f"{same} Content-Type, Location...", *headers)
    marked = f"Idempotent-Replayed: {second.headers.get('Idempotent-Replayed', '(absent)')}"
    if second.replayed and not first.replayed:
        probe.add("replay-marker", "Idempotent-Replayed: true", marked, "pass")
    else:
        probe.add(
            "replay-marker",
            "Idempotent-Replayed: true",
            marked,
            "fail",
            "the retry's answer does not say it is a replay (Idempotent-Replayed: true), so "
            "a client cannot tell a replay from a second execution."
            + (
                f" The first answer was {first.summary()}, a refusal, which an endpoint may "
                "leave unstored: check the request (credentials, body)."
                if first.status is not None and first.status >= 400
                else ""
            ),
        )
    probe.add("replay-per-exchange", "new or absent on the replay", *_per_exchange(first, second))
    if config.runs("replay-effects"):
        delta = effect_delta(before, after)
        assert delta is not None
        ok = delta == 1
        probe.add(
            "replay-effects",
            "the effect counter moves by 1",
            f"moved by {count(delta)}",
            "pass" if ok else "fail",
            "" if ok else f"a request and its retry took effect {count(delta)} times, not once.",
        )
    return first, key


def _date(exchange: Exchange) -> float | None:
    value = exchange.headers.get("Date")
    if not value:
        return None
    try:
        return email.utils.parsedate_to_datetime(value).timestamp()
    except (TypeError, ValueError, IndexError):
        return None


def _compare_body(first: Exchange, second: Exchange) -> tuple[str, Verdict, str]:
    if second.body == first.body:
        return f"{len(second.body)} bytes, the same", "pass", ""
    at = next(
        (i for i, (a, b) in enumerate(zip(first.body, second.body, strict=False)) if a != b),
        min(len(first.body), len(second.body)),
    )
    return (
        f"{len(second.body)} bytes, different from byte {at}",
        "fail",
        "the replay's body is not the first answer's bytes.",
    )


def _compare_headers(first: Exchange, second: Exchange) -> tuple[str, Verdict, str]:
    differ = []
    for name in REPRESENTATION_HEADERS:
        a, b = first.headers.get(name), second.headers.get(name)
        if a != b:
            differ.append(f"{name}: {a!r} then {b or '(absent)'!r}")
    kept = [name for name in REPRESENTATION_HEADERS if first.headers.get(name) is not None]
    if not differ:
        return f"the same ({', '.join(kept) or 'none sent'})", "pass", ""
    return (
        "; ".join(differ),
        "fail",
        "the replay does not describe its body as the first answer did ("
        + ", ".join(d.split(":")[0] for d in differ)
        + "); a client reading the replay's body by its Content-Type misreads it.",
    )


def _per_exchange(first: Exchange, second: Exchange) -> tuple[str, Verdict, str]:
    seen: list[str] = []
    replayed: list[str] = []
    for name in ("Set-Cookie", *TRACING_HEADERS):
        value = first.headers.get(name)
        if value is not None:
            seen.append(name)
            if second.headers.get(name) == value:
                replayed.append(name)
    # Date has a resolution of one second: two answers stamped a second or more apart
    # (on any clock running at the server's rate) carry two dates.
    apart = second.sent_at - first.received_at >= 1.0
    if _date(first) is not None and apart:
        seen.append("Date")
        if first.headers.get("Date") == second.headers.get("Date"):
            replayed.append("Date")
    if not seen:
        return "no Set-Cookie, tracing id, or Date a second apart, to compare", "skip", ""
    if not replayed:
        return f"new or absent: {', '.join(seen)}", "pass", ""
    return (
        f"repeated: {', '.join(replayed)}",
        "fail",
        f"the replay repeats the first exchange's {', '.join(replayed)}: a session cookie, "
        "the moment or a tracing id of another request handed to the retry.",
    )


def principal_scoping(probe: Probe, first: tuple[Exchange, str] | None) -> None:
    """``principal-scoping``: the first request's key, sent by a second principal.

    Keys are scoped to the principal (the draft: the key is unique per client), so the
    second principal's request must not get the first principal's answer.
    """
    expected = "not the first principal's replay"
    if not probe.config.runs("principal-scoping") or first is None:
        why = "no second principal given" if first else "no first answer to compare"
        probe.add("principal-scoping", expected, why, "skip")
        return
    first_answer, key = first
    other = dict(probe.config.headers)
    other.update(dict(probe.config.other_headers))
    answer = probe.observe(
        probe.sender.send("second principal", key=key, principal=list(other.items()))
    )
    observed = answer.summary() + (", marked replayed" if answer.replayed else "")
    executed = first_answer.status is not None and first_answer.status < 400
    same_body = bool(first_answer.body) and answer.body == first_answer.body
    if answer.replayed or (executed and same_body):
        probe.add(
            "principal-scoping",
            expected,
            observed + ", the first principal's body",
            "fail",
            "the second principal got the first principal's stored answer for the same "
            "key: keys are not scoped to the principal, so one client reads another's "
            "results by guessing or reusing a key.",
        )
    elif answer.status is None or answer.status >= 500:
        probe.add("principal-scoping", expected, observed, "fail", "a server error or no answer.")
    else:
        probe.add("principal-scoping", expected, observed, "pass")


def key_reused(probe: Probe, first: tuple[Exchange, str] | None) -> None:
    """``key-reused``: the first request's key with another body is refused (422)."""
    expected = "422 (the IETF draft), not executed"
    if not probe.config.runs("key-reused") or first is None:
        probe.add("key-reused", expected, "no first answer to compare", "skip")
        return
    first_answer, key = first
    body, content_type = probe.config.reuse_body()
    before = probe.effects()
    answer = probe.observe(
        probe.sender.send("same key, other body", key=key, body=body, content_type=content_type)
    )
    delta = effect_delta(before, probe.effects())
    observed = answer.summary() + (", marked replayed" if answer.replayed else "")
    if delta:
        observed += f"; effect counter moved by {count(delta)}"
    if answer.status is not None and 400 <= answer.status < 500 and not answer.replayed:
        probe.refusals.append(answer)
    verdict: Verdict = "fail"
    if delta:
        detail = "a request with a used key and another body took effect."
    elif answer.replayed or (
        first_answer.body
        and (first_answer.status or 500) < 400
        and (answer.status, answer.body) == (first_answer.status, first_answer.body)
    ):
        verdict = "fail"
        detail = (
            "the first request's answer was replayed to a different request: the endpoint "
            "does not compare the request with the one that used the key first."
        )
    elif answer.status == 422:
        verdict, detail = "pass", ""
    elif answer.status is not None and 400 <= answer.status < 500:
        verdict = "warn"
        detail = f"refused with {answer.status}; the IETF draft answers 422 for a reused key."
    elif answer.status is None or answer.status >= 500:
        verdict, detail = "fail", "a server error or no answer for a client mistake."
    else:
        verdict = "fail"
        detail = "a different request with a used key was executed as a new request."
    probe.add("key-reused", expected, observed, verdict, detail)
