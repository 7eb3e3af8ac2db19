"""Duplicates at the same time: N concurrent ones, and one sent while the first is in flight."""

from __future__ import annotations

import contextlib
import threading

from django_idempotency.conformance.probe import Probe, count, effect_delta
from django_idempotency.conformance.report import Verdict
from django_idempotency.conformance.traffic import BudgetExhausted, Exchange, new_key


def _stripped_hint(answers: list[Exchange]) -> str:
    """Why an endpoint refuses every keyed request, from the answers' problem types."""
    if any(a.slug == "missing-key" for a in answers):
        return (
            " The endpoint says the key is missing although every request carried one: "
            "the Idempotency-Key header does not reach the application (a proxy, load "
            "balancer or middleware in between strips it)."
        )
    return (
        " Check the request (method, body, credentials), and that the Idempotency-Key "
        "header reaches the application."
    )


def concurrent_duplicates(probe: Probe) -> None:
    """``concurrent-duplicates`` and ``concurrent-effects``: N requests, one key, at once.

    N threads wait at a barrier, then each sends the request with the same fresh key.
    A conforming endpoint executes it once: one first answer, every other answer a
    replay of it (``Idempotent-Replayed: true``, same status and body) or a 409.
    """
    config = probe.config
    n = config.concurrency
    expected = f"1 first answer; the other {n - 1} replays of it or 409 with Retry-After"
    effects_expected = "the effect counter moves by 1"
    if not config.runs("concurrent-duplicates"):
        probe.add("concurrent-duplicates", expected, "", "skip")
        if config.runs("concurrent-effects"):
            probe.skip("concurrent-effects", effects_expected, "skipped with its duplicates")
        return
    before = probe.effects()
    key = new_key()
    barrier = threading.Barrier(n)
    answers: list[Exchange | None] = [None] * n
    stopped: list[BudgetExhausted] = []

    def one(index: int) -> None:
        # A thread slow to start breaks the barrier: the others send anyway.
        with contextlib.suppress(threading.BrokenBarrierError):
            barrier.wait(timeout=config.timeout)
        try:
            answers[index] = probe.sender.send(f"duplicate {index + 1}/{n}", key=key)
        except BudgetExhausted as exc:
            stopped.append(exc)

    threads = [threading.Thread(target=one, args=(i,), daemon=True) for i in range(n)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=config.time_budget)
    if stopped:
        raise stopped[0]
    after = probe.effects()
    got = [a for a in answers if a is not None]
    for answer in got:
        probe.observe(answer)
        if answer.status == 409 and not answer.replayed:
            probe.refusals.append(answer)
    broken = [a for a in got if a.status is None or a.status >= 500]
    replays = [a for a in got if a.replayed and a not in broken]
    conflicts = [a for a in got if a.status == 409 and not a.replayed]
    firsts = [a for a in got if a not in broken and a not in replays and a not in conflicts]
    observed = (
        f"{len(firsts)} first answer(s) ({_statuses(firsts)}), {len(replays)} replays, "
        f"{len(conflicts)} x 409"
    )
    if broken:
        observed += f", {len(broken)} errors ({_statuses(broken)})"
    verdict, detail = _judge(n, firsts, replays, broken, effect_delta(before, after))
    probe.add("concurrent-duplicates", expected, observed, verdict, detail)
    if not config.runs("concurrent-effects"):
        return
    delta = effect_delta(before, after)
    assert delta is not None
    if delta == 1:
        probe.add("concurrent-effects", effects_expected, "moved by 1", "pass")
        return
    probe.add(
        "concurrent-effects",
        effects_expected,
        f"moved by {count(delta)}",
        "fail",
        f"{n} concurrent duplicates with one key took effect {count(delta)} times, not once"
        + (" (or it is not counted by the time the answer is sent)." if delta == 0 else "."),
    )


def _judge(
    n: int,
    firsts: list[Exchange],
    replays: list[Exchange],
    broken: list[Exchange],
    delta: float | None,
) -> tuple[Verdict, str]:
    """The verdict of ``concurrent-duplicates`` on its answers, and what is wrong."""
    if len(firsts) > 1 and all(a.status is not None and a.status >= 400 for a in firsts):
        return "fail", f"every request was refused ({_statuses(firsts)})." + _stripped_hint(firsts)
    if len(firsts) > 1 and _alike(firsts) and delta == 1:
        return "fail", (
            f"{len(firsts)} of {n} answers are alike and none is marked as a replay; the "
            "effect counter moved by 1, so the request ran once: the replays lack "
            "Idempotent-Replayed: true, and a client cannot tell them from executions."
        )
    if len(firsts) > 1:
        return "fail", (
            f"{len(firsts)} of {n} requests with one Idempotency-Key were answered as first "
            "executions (neither replays nor 409): the request ran more than once. A "
            "check-then-execute cache (look the key up, run the handler, store the answer) "
            "lets concurrent duplicates all run; the key must be claimed atomically before "
            "the handler runs."
        )
    if not firsts:
        return "fail", (
            "no answer was the execution itself: every request got a 409, a replay or a "
            f"server error ({_statuses(broken) if broken else 'none'}), so no client learned "
            "the result from this burst."
        )
    first = firsts[0]
    differ = [a for a in replays if (a.status, a.body) != (first.status, first.body)]
    if differ:
        return "fail", (
            f"{len(differ)} replay(s) differ from the first answer ({first.status}, "
            f"{len(first.body)} bytes): e.g. {differ[0].status}, {len(differ[0].body)} bytes."
        )
    if broken and delta not in (None, 1):
        return "fail", f"{len(broken)} of {n} duplicates got a server error or no answer."
    if broken:
        return "warn", (
            f"{len(broken)} of {n} duplicates got a server error or no answer "
            f"({_statuses(broken)}). The request still ran once (one first answer"
            f"{', and the effect counter moved by 1' if delta == 1 else ''}), and a client "
            "that retries with the same key gets the replay; but find the cause in the "
            "server's log (a lock timeout, a worker killed, a connection limit)."
        )
    return "pass", ""


def _alike(answers: list[Exchange]) -> bool:
    """Every answer has the first one's status and body bytes."""
    return all((a.status, a.body) == (answers[0].status, answers[0].body) for a in answers)


def _statuses(answers: list[Exchange]) -> str:
    """``"201 x 3, 500"``: the answers' summaries, counted."""
    counts: dict[str, int] = {}
    for answer in answers:
        counts[answer.summary()] = counts.get(answer.summary(), 0) + 1
    return ", ".join(f"{s} x {n}" if n > 1 else s for s, n in counts.items()) or "none"


def in_flight(probe: Probe) -> None:
    """``in-flight``: a duplicate sent while the original runs gets 409 at once.

    The original goes to the slow URL; ``in_flight_delay`` seconds later (or as soon as
    the original answers, which makes the check inconclusive) the duplicate follows
    with the same key. One of the two must be a 409 answered within ``in_flight_quick``
    seconds: a duplicate that waits for the original holds a connection (and a server
    worker) for as long as the handler runs.
    """
    config = probe.config
    expected = f"409 for the duplicate within {config.in_flight_quick:g} s"
    url = config.slow_url
    if url is None or not config.runs("in-flight"):
        probe.skip("in-flight", expected, "no slow handler given (--slow-query or --slow)")
        return
    key = new_key()
    holder: list[Exchange] = []
    stopped: list[BudgetExhausted] = []

    def original() -> None:
        try:
            holder.append(probe.sender.send("in-flight original", url=url, key=key))
        except BudgetExhausted as exc:
            stopped.append(exc)

    thread = threading.Thread(target=original, daemon=True)
    thread.start()
    thread.join(timeout=config.in_flight_delay)  # returns early if the original answered
    if not thread.is_alive():
        if stopped:
            raise stopped[0]
        first = holder[0]
        probe.add(
            "in-flight",
            expected,
            f"the original answered ({first.summary()}) in {first.elapsed:.2f} s, before "
            "the duplicate was sent",
            "warn",
            "inconclusive: the handler was not slow enough; make it slower (--slow-query) "
            "or lower --in-flight-delay.",
        )
        return
    duplicate = probe.observe(probe.sender.send("in-flight duplicate", url=url, key=key))
    thread.join(timeout=config.time_budget)
    if stopped:
        raise stopped[0]
    first = probe.observe(holder[0])
    pair = [a for a in (duplicate, first) if a.status == 409 and not a.replayed]
    probe.refusals.extend(pair)
    observed = (
        f"duplicate {duplicate.summary()} in {duplicate.elapsed:.2f} s; original "
        f"{first.summary()} in {first.elapsed:.2f} s"
    )
    if len(pair) == 1 and pair[0].elapsed <= config.in_flight_quick:
        probe.add("in-flight", expected, observed, "pass")
        return
    if pair or duplicate.replayed:
        detail = (
            f"the duplicate was held{' until the original finished' if not pair else ''}, "
            f"then answered{' 409' if pair else ''}: a blocked connection (and a server worker) "
            "per duplicate for as long as the handler runs; a duplicate of a request in "
            f"flight should get 409 with Retry-After at once (within {config.in_flight_quick:g} s)."
        )
    elif duplicate.status is None or duplicate.status >= 500:
        detail = "the duplicate of a request in flight got a server error or no answer."
    else:
        detail = (
            "the duplicate was answered as an execution of its own while the original was "
            "in flight: the request ran twice."
        )
    probe.add("in-flight", expected, observed, "fail", detail)
