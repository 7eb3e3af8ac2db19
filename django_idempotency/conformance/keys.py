"""Keys the endpoint must refuse, safe methods that ignore keys, and the error format."""

from __future__ import annotations

from django_idempotency.client.responses import HEADER, retry_after_seconds
from django_idempotency.conformance.probe import Probe, count, effect_delta
from django_idempotency.conformance.report import Verdict
from django_idempotency.conformance.traffic import KEY_PREFIX, HeaderList, new_key


def bad_keys(probe: Probe) -> list[tuple[str, str, HeaderList]]:
    """The ``key-*`` cases: name, what is wrong, and the header lines sent."""
    too_long = probe.config.max_key_length + 1
    long_key = (KEY_PREFIX + "x" * too_long)[:too_long]
    return [
        ("key-missing", "no Idempotency-Key", []),
        ("key-empty", "an empty Idempotency-Key", [(HEADER, "")]),
        (
            "key-too-long",
            f"a key of {len(long_key)} characters (the limit: {probe.config.max_key_length})",
            [(HEADER, long_key)],
        ),
        ("key-non-ascii", "a non-ASCII key (UTF-8 'é')", [(HEADER, f"{new_key()}-é".encode())]),
        (
            "key-two-lines",
            "two Idempotency-Key header lines",
            [(HEADER, new_key()), (HEADER, new_key())],
        ),
    ]


def refused_keys(probe: Probe) -> None:
    """The ``key-*`` checks: each bad key is refused with a 4xx and never executed.

    The request is the endpoint's own (method, body, credentials); only the key is
    wrong. With an effect counter, "never executed" is read from it; without one, from
    the status (a 2xx or 3xx answer means the handler ran).
    """
    expected = "4xx (400), not executed"
    for name, what, lines in bad_keys(probe):
        if not probe.config.runs(name):
            why = "the endpoint's key is optional (--key-optional)"
            probe.add(name, expected, why if name == "key-missing" else "", "skip")
            continue
        before = probe.effects()
        answer = probe.observe(probe.sender.send(name, headers=lines))
        delta = effect_delta(before, probe.effects())
        observed = answer.summary() + (f"; effects +{count(delta)}" if delta else "")
        status = answer.status
        if status is not None and 400 <= status < 500:
            probe.refusals.append(answer)
        verdict: Verdict = "fail"
        if delta:
            detail = f"a request with {what} was executed ({count(delta)} effects)."
        elif status is None or status >= 500:
            verdict = "fail"
            detail = (
                f"{what} got {answer.summary()}: a client mistake answered as a server error "
                "(or a dropped connection); it must be a 4xx that says what is wrong."
            )
        elif status < 400:
            verdict = "fail"
            detail = f"a request with {what} was accepted ({status}): it ran without protection."
        else:
            verdict, detail = "pass", ""
        if name == "key-too-long" and verdict == "fail" and status is not None and status < 500:
            detail += " If the endpoint's limit is higher, say so with --max-key-length."
        probe.add(name, expected, observed, verdict, detail)


def safe_method(probe: Probe) -> None:
    """``safe-method``: GET (or the given safe method) answers alike with and without a key.

    Four requests: no key; an invalid key (``a,b``); a valid key twice. Expected: the
    same status each time, and no replay marker (a safe method is never recorded).
    """
    config = probe.config
    method = config.safe_method or "GET"
    expected = f"{method} answers alike with any key, never a replay"
    if not config.runs("safe-method"):
        probe.add("safe-method", expected, "no safe method given (--safe-method '')", "skip")
        return
    key = new_key()
    answers = [
        probe.sender.send(f"{method} without a key", method=method, body=b""),
        probe.sender.send(f"{method} with an invalid key", method=method, body=b"", key="a,b"),
        probe.sender.send(f"{method} with a key", method=method, body=b"", key=key),
        probe.sender.send(f"{method} with the key again", method=method, body=b"", key=key),
    ]
    observed = ", ".join(a.summary() for a in answers)
    plain = answers[0]
    if any(a.replayed for a in answers):
        detail = f"a {method} with a key was answered as a replay: safe methods are never recorded."
        probe.add("safe-method", expected, observed + " (replayed)", "fail", detail)
    elif any(a.status != plain.status for a in answers[1:]):
        detail = (
            f"{method} answered differently with a key ({observed}): the key must be ignored "
            "on safe methods, even an invalid one."
        )
        probe.add("safe-method", expected, observed, "fail", detail)
    else:
        probe.add("safe-method", expected, observed, "pass")


def retry_after_on_409(probe: Probe) -> None:
    """``retry-after-on-409``: every 409 seen carried a valid ``Retry-After``."""
    expected = "Retry-After (seconds or a date) on every 409"
    if not probe.conflicts:
        probe.add("retry-after-on-409", expected, "no 409 was answered in this run", "skip")
        return
    missing = [c for c in probe.conflicts if retry_after_seconds(c.response()) is None]
    observed = f"{len(probe.conflicts) - len(missing)} of {len(probe.conflicts)} 409s carry it"
    if missing:
        probe.add(
            "retry-after-on-409",
            expected,
            observed,
            "fail",
            f"{len(missing)} 409 answer(s) without a usable Retry-After "
            f"({missing[0].headers.get('Retry-After', 'absent')!r}): a client cannot tell "
            "when to retry and hammers the endpoint or gives up.",
        )
    else:
        probe.add("retry-after-on-409", expected, observed, "pass")


def problem_json(probe: Probe) -> None:
    """``problem-json``: the endpoint's refusals are ``application/problem+json`` (RFC 9457)."""
    expected = "application/problem+json on each refusal"
    if not probe.refusals:
        probe.add("problem-json", expected, "no refusal was answered in this run", "skip")
        return
    plain = [r for r in probe.refusals if not r.problem_json]
    observed = f"{len(probe.refusals) - len(plain)} of {len(probe.refusals)} refusals"
    if plain:
        names = sorted({f"{r.label} ({r.status})" for r in plain})
        probe.add(
            "problem-json",
            expected,
            observed,
            "fail",
            f"not problem+json: {', '.join(names)} (Content-Type "
            f"{plain[0].headers.get('Content-Type', 'absent')!r}).",
        )
    else:
        probe.add("problem-json", expected, observed, "pass")
