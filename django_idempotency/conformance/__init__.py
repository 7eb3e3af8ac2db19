"""A conformance check of a live endpoint that claims to implement ``Idempotency-Key``.

Sends a bounded set of requests to one URL (any server, Django or not, through its
proxies and middleware) and tells whether the endpoint keeps the promise: one execution
per key under concurrent duplicates, faithful replays, another body refused, bad keys
refused with a 4xx and never run, safe methods untouched, problem+json errors,
``Retry-After`` on 409, and optionally a quick 409 while the first request is in flight.
See ``docs/conformance.md`` for every request it sends.

Three ways to run it, all with the ``client`` extra (httpx)::

    idempotency-conformance https://staging.example.com/v1/orders --json '{"item": "w"}'
    python -m django_idempotency.conformance ...
    assert_conforms("https://...", body=b'{"item": "w"}', content_type="application/json")

It imports neither Django nor the rest of the package, only ``client`` (for reading
answers). Its modules: ``config`` (the options and their limits), ``traffic`` (the
only way a request is sent: the allowed URLs, the cap and the deadline), ``duplicates``,
``replay`` and ``keys`` (the checks), ``report`` (table and JSON), ``runner`` (one run,
and the test assertion), ``cli``.
"""

from __future__ import annotations

try:
    import httpx  # noqa: F401
except ImportError as exc:  # pragma: no cover - exercised in a subprocess test
    raise ImportError(
        f"django_idempotency.conformance needs httpx ({exc.name} is missing). "
        "Install it with: pip install 'django-idempotency[client]'"
    ) from exc

from django_idempotency.conformance.config import CHECK_NAMES, Config, ConfigError
from django_idempotency.conformance.report import CheckResult, Report
from django_idempotency.conformance.runner import NonConformance, assert_conforms, run

__all__ = [
    "CHECK_NAMES",
    "CheckResult",
    "Config",
    "ConfigError",
    "NonConformance",
    "Report",
    "assert_conforms",
    "run",
]
