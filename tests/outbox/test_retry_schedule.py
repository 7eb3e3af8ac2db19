"""The retry schedule: the defaults ride out a downstream outage of more than a day,
and the table of elapsed times in docs/outbox.md is the one the code computes."""

from __future__ import annotations

import re
from pathlib import Path

from django_idempotency.conf import DEFAULTS, conf
from django_idempotency.outbox import failures

DOCS = Path(__file__).resolve().parents[2] / "docs" / "outbox.md"
BEGIN = "<!-- retry schedule: checked by tests/outbox/test_retry_schedule.py -->"
END = "<!-- end of retry schedule -->"


def human(seconds: float) -> str:
    """``"1 d 10 h"``, ``"9 h 6 min"``, ``"3 s"``: the two largest units, rounded down."""
    left = int(seconds)
    parts = []
    for unit, size in (("d", 86400), ("h", 3600), ("min", 60), ("s", 1)):
        if left >= size or (unit == "s" and not parts):
            parts.append(f"{left // size} {unit}")
            left %= size
    return " ".join(parts[:2])


def table() -> str:
    """The schedule of the default settings as the docs' Markdown table."""
    rows = failures.schedule(
        conf.outbox_max_attempts, base=conf.outbox_backoff_base, cap=conf.outbox_backoff_cap
    )
    lines = ["| attempt | starts after the first, at the earliest | at the latest |"]
    lines.append("| ---: | ---: | ---: |")
    lines += [f"| {n} | {human(early)} | {human(late)} |" for n, early, late in rows]
    return "\n".join(lines)


def test_the_docs_show_the_retry_schedule_of_the_default_settings():
    text = DOCS.read_text()
    found = re.search(re.escape(BEGIN) + r"\n\n(.*?)\n\n" + re.escape(END), text, re.S)
    assert found, f"docs/outbox.md has no table between {BEGIN!r} and {END!r}"
    expected = table()
    assert found.group(1) == expected, f"docs/outbox.md's schedule is not the code's:\n{expected}"


def test_the_defaults_ride_out_a_downstream_outage_of_a_day():
    """A message failing since its first attempt reaches its last attempt (whose failure
    dead-letters it) no sooner than a day later, and no later than three days."""
    assert (DEFAULTS["OUTBOX_MAX_ATTEMPTS"], DEFAULTS["OUTBOX_BACKOFF_CAP"]) == (
        conf.outbox_max_attempts,
        conf.outbox_backoff_cap,
    )  # the test settings keep the defaults
    *_, (attempt, earliest, latest) = failures.schedule(
        conf.outbox_max_attempts, base=conf.outbox_backoff_base, cap=conf.outbox_backoff_cap
    )
    assert attempt == conf.outbox_max_attempts
    assert earliest >= 86400
    assert latest <= 3 * 86400


def test_each_delay_lies_between_half_its_bound_and_its_bound():
    """Equal jitter: the random half spreads retries out, the fixed half keeps the
    schedule's floor."""
    for attempts, bound in ((1, 2.0), (4, 16.0), (30, 21600.0)):
        low = failures.backoff(attempts, base=2.0, cap=21600.0, rand=lambda: 0.0)
        high = failures.backoff(attempts, base=2.0, cap=21600.0, rand=lambda: 0.999999)
        assert (low, round(high, 2)) == (bound / 2, round(bound * 0.9999995, 2))
