"""System checks for misconfiguration, with stable ids (``django_idempotency.E001``...).

Each check is documented in ``docs/checks.md`` with its fix.
"""

from __future__ import annotations

import difflib
import sys
from collections.abc import Iterator, Sequence
from typing import Any

from django.apps import AppConfig
from django.conf import settings
from django.core.checks import CheckMessage, Error, Tags, Warning, register

from django_idempotency.conf import DEFAULTS, conf
from django_idempotency.protocol.responses import FORBIDDEN_HEADERS
from django_idempotency.retention.sweeper import SWEEP_TASK
from django_idempotency.store import stricter_than_read_committed
from django_idempotency.store.routing import outbox_database, record_database


def _nearest_setting(name: object) -> str:
    """A hint for an unknown setting: the closest known name, else where they are listed."""
    close = difflib.get_close_matches(str(name).upper(), DEFAULTS, n=1, cutoff=0.6)
    if close:
        return f"Did you mean {close[0]}? (docs/configuration.md lists every setting.)"
    return "docs/configuration.md lists every setting."


@register()
def check_settings(
    app_configs: Sequence[AppConfig] | None = None, **kwargs: Any
) -> list[CheckMessage]:
    """Validate ``settings.IDEMPOTENCY`` (E001-E005)."""
    raw = getattr(settings, "IDEMPOTENCY", {})
    if not isinstance(raw, dict):
        return [
            Error(
                "IDEMPOTENCY must be a dict.",
                hint="Set IDEMPOTENCY = {} or a dict of the documented keys.",
                id="django_idempotency.E001",
            )
        ]
    errors: list[CheckMessage] = []
    for name in sorted(set(raw) - set(DEFAULTS), key=str):
        errors.append(
            Error(
                f"Unknown IDEMPOTENCY setting: {name!r}.",
                hint=_nearest_setting(name),
                id="django_idempotency.E001",
            )
        )
    try:
        max_length = conf.max_key_length
    except (TypeError, ValueError):
        max_length = -1
    if not 1 <= max_length <= 255:
        errors.append(
            Error(
                "IDEMPOTENCY['MAX_KEY_LENGTH'] must be an integer from 1 to 255.",
                hint="Keys are stored in a 255-character column; 255 is the default.",
                id="django_idempotency.E002",
            )
        )
    errors.extend(_check_durations())
    errors.extend(_check_retention())
    errors.extend(_check_fractions())
    forbidden = sorted(h for h in conf.replay_headers if h.lower() in FORBIDDEN_HEADERS)
    if forbidden:
        errors.append(
            Error(
                f"IDEMPOTENCY['REPLAY_HEADERS'] names headers that are never stored or "
                f"replayed: {', '.join(forbidden)}.",
                hint="Credentials, cookies, hop-by-hop and tracing headers belong to one "
                "request; remove them from REPLAY_HEADERS.",
                id="django_idempotency.E004",
            )
        )
    for name in ("PRINCIPAL_RESOLVER", "RELEASE_PREDICATE"):
        try:
            getattr(conf, name.lower())
        except ImportError as exc:
            errors.append(
                Error(
                    f"IDEMPOTENCY['{name}'] cannot be imported: {exc}.",
                    hint="Give a dotted path to a callable, or the callable itself.",
                    id="django_idempotency.E005",
                )
            )
    return errors


def _raw(name: str) -> str:
    """The configured value of ``IDEMPOTENCY[name]`` for a message (its default if unset)."""
    return repr(conf.get(name))


def _check_durations() -> Iterator[CheckMessage]:
    try:
        lease, retention, wait = conf.lease, conf.retention, conf.wait
    except (TypeError, ValueError):
        lease = retention = wait = -1.0
    if lease <= 0 or retention <= 0 or wait < 0:
        yield Error(
            "IDEMPOTENCY['LEASE'] and IDEMPOTENCY['RETENTION'] must be positive numbers "
            "of seconds and IDEMPOTENCY['WAIT'] zero or more (they are "
            f"{_raw('LEASE')}, {_raw('RETENTION')} and {_raw('WAIT')}).",
            hint="Defaults: LEASE 60, RETENTION 86400 (24 h), WAIT 0.",
            id="django_idempotency.E003",
        )
    elif lease >= retention:
        yield Error(
            f"IDEMPOTENCY['LEASE'] ({lease:g} s) must be shorter than "
            f"IDEMPOTENCY['RETENTION'] ({retention:g} s).",
            hint="A record must outlive its lease, or an in-flight request could be "
            "forgotten before it finishes.",
            id="django_idempotency.E003",
        )


def _check_fractions() -> Iterator[CheckMessage]:
    """E013: the failure signatures' fractions (docs/observability.md#failure-signatures)."""
    for name in ("LEASE_WARNING_FRACTION", "RETENTION_WARNING_FRACTION"):
        try:
            value = float(conf.get(name))
        except (TypeError, ValueError):
            value = -1.0
        if not 0 < value <= 1:
            yield Error(
                f"IDEMPOTENCY['{name}'] must be a number above 0 and at most 1 "
                f"(it is {_raw(name)}).",
                hint="A share of the lease or of the retention window; the default is 0.8.",
                id="django_idempotency.E013",
            )


def _check_retention() -> Iterator[CheckMessage]:
    """E006: the sweeper's settings (docs/retention.md)."""
    try:
        values = (
            conf.max_retention,
            conf.partitions_ahead,
            conf.sweep_batch_size,
            conf.outbox_retention,
        )
    except (TypeError, ValueError):
        values = (-1.0, -1, -1, -1.0)
    max_retention, ahead, batch, outbox = values
    if max_retention <= 0 or ahead < 0 or batch < 1 or outbox <= 0:
        yield Error(
            "IDEMPOTENCY['MAX_RETENTION'] and ['OUTBOX_RETENTION'] must be positive "
            "numbers of seconds, ['PARTITIONS_AHEAD'] 0 or more days and "
            "['SWEEP_BATCH_SIZE'] at least 1.",
            hint="Defaults: MAX_RETENTION and OUTBOX_RETENTION 604800 (7 days), "
            "PARTITIONS_AHEAD 3, SWEEP_BATCH_SIZE 5000.",
            id="django_idempotency.E006",
        )


# --- Production readiness (W003, W004, E007) ------------------------------------------

#: Largest ``MAX_RESPONSE_BYTES``: PostgreSQL's limit for one ``bytea`` value (1 GB).
MAX_RESPONSE_BYTES_LIMIT = 1024**3 - 1


def _silence_hint(check_id: str) -> str:
    return f"If this is deliberate, add {check_id!r} to SILENCED_SYSTEM_CHECKS."


def _test_environment() -> bool:
    """Whether Django's test environment is set up (the test runner, pytest-django).

    ``django.test.utils.setup_test_environment()`` forces ``DEBUG = False`` and installs
    the in-memory email outbox (``django.core.mail.outbox``), which a deployment never
    has: the production checks use the outbox to tell a test run from production.
    """
    from django.core import mail

    return hasattr(mail, "outbox")


@register()
def check_production_database(
    app_configs: Sequence[AppConfig] | None = None, **kwargs: Any
) -> list[CheckMessage]:
    """W003: the records' database is not PostgreSQL while ``DEBUG`` is ``False``.

    Silent under Django's test environment, which sets ``DEBUG = False`` itself (a test
    database on SQLite is no production deployment).
    """
    if settings.DEBUG or _test_environment():
        return []
    from django.db import connections

    warnings: list[CheckMessage] = []
    for alias in sorted({record_database(), outbox_database()}):
        vendor = connections[alias].vendor
        if vendor != "postgresql":
            warnings.append(
                Warning(
                    f"django-idempotency keeps its records in the {alias!r} database, "
                    f"which is {vendor}, not PostgreSQL, while DEBUG is False. Production "
                    "guarantees (database clock for leases, concurrent claims across "
                    "processes, partitioned retention) are documented for PostgreSQL.",
                    hint="Use PostgreSQL in production (docs/storage.md); SQLite suits "
                    "one process. " + _silence_hint("django_idempotency.W003"),
                    id="django_idempotency.W003",
                )
            )
    return warnings


@register()
def check_isolation_level(
    app_configs: Sequence[AppConfig] | None = None, **kwargs: Any
) -> list[CheckMessage]:
    """W006: the records' database runs above READ COMMITTED (docs/retention.md)."""
    from django.db import connections

    alias = record_database()
    if not stricter_than_read_committed(connections[alias]):
        return []
    return [
        Warning(
            f"The {alias!r} database, which holds the idempotency records, opens its "
            "transactions above READ COMMITTED. Claims still work (each runs in its own "
            "READ COMMITTED transaction, two more round trips), but extend_lease() "
            "raises HeartbeatUnavailable: a heartbeat committed beside the view's "
            "transaction would make the view's own completion fail to serialize.",
            hint="Give long-running views a lease longer than their longest run, or use "
            "READ COMMITTED for this database. " + _silence_hint("django_idempotency.W006"),
            id="django_idempotency.W006",
        )
    ]


def _static_schedules() -> Iterator[Any]:
    """The beat schedules configured in settings or on the running Celery app."""
    for name in ("CELERY_BEAT_SCHEDULE", "CELERYBEAT_SCHEDULE"):
        yield getattr(settings, name, None)
    if "celery" in sys.modules:  # never import Celery just for a check
        yield sys.modules["celery"].current_app.conf.beat_schedule


def _sweeper_in_static_schedule() -> bool:
    for schedule in _static_schedules():
        if isinstance(schedule, dict) and any(
            isinstance(entry, dict) and entry.get("task") == SWEEP_TASK
            for entry in schedule.values()
        ):
            return True
    return False


def _no_sweeper(where: str, looked: str = "") -> Warning:
    return Warning(
        f"No Celery beat schedule runs the retention sweeper ({SWEEP_TASK!r}) {where}: "
        "expired idempotency records and sent outbox messages will pile up.",
        hint=f"{looked}Schedule the task {SWEEP_TASK!r} hourly with Celery beat, or run "
        "'manage.py idempotency_sweep' from cron (docs/retention.md). "
        + _silence_hint("django_idempotency.W004"),
        id="django_idempotency.W004",
    )


@register(deploy=True)  # only with `check --deploy`: cron may run the sweeper instead
def check_sweeper_scheduled(
    app_configs: Sequence[AppConfig] | None = None, **kwargs: Any
) -> list[CheckMessage]:
    """W004: ``DEBUG`` is ``False`` and no beat schedule in settings runs the sweeper.

    With ``django_celery_beat`` installed the schedule lives in the database: the
    database-tagged :func:`check_sweeper_scheduled_in_database` looks there instead.
    """
    if settings.DEBUG or _sweeper_in_static_schedule():
        return []
    if "django_celery_beat" in settings.INSTALLED_APPS:
        return []
    return [_no_sweeper("in CELERY_BEAT_SCHEDULE")]


def _beat_databases(periodic_task: Any) -> tuple[list[str], str]:
    """Where django-celery-beat's scheduler reads its ``PeriodicTask`` rows, and the words.

    The database the routers send django_celery_beat's reads to (``db_for_read``, as
    the scheduler's own queries are sent); every database when that is unclear (a
    router fails without the hints of a request, or names an unknown alias).
    """
    from django.db import router

    try:
        alias = str(router.db_for_read(periodic_task))
    except Exception:  # a router that needs a request's or a tenant's context
        alias = ""
    if alias in settings.DATABASES:
        where = (
            f"the {alias!r} database, where the database routers send django_celery_beat's reads"
        )
        return [alias], where
    aliases = list(settings.DATABASES)
    return aliases, "every database (" + ", ".join(map(repr, aliases)) + ")"


@register(Tags.database, deploy=True)
def check_sweeper_scheduled_in_database(
    app_configs: Sequence[AppConfig] | None = None,
    databases: Sequence[str] | None = None,
    **kwargs: Any,
) -> list[CheckMessage]:
    """W004 with ``django_celery_beat``: no enabled ``PeriodicTask`` runs the sweeper.

    Runs only when a command asks for database checks (``check --database default``,
    ``migrate``); then looks where the scheduler reads its rows (:func:`_beat_databases`),
    whichever database the command named, and says in the hint where it looked.
    """
    if not databases or settings.DEBUG or "django_celery_beat" not in settings.INSTALLED_APPS:
        return []
    if _sweeper_in_static_schedule():
        return []
    from django.apps import apps
    from django.db import DatabaseError

    app_label, model_name = "django_celery_beat", "PeriodicTask"  # optional: not typed here
    periodic_task = apps.get_model(app_label, model_name)
    aliases, where = _beat_databases(periodic_task)
    migrated = False
    for alias in aliases:
        try:
            if periodic_task.objects.using(alias).filter(task=SWEEP_TASK, enabled=True).exists():
                return []
        except DatabaseError:  # not migrated there (yet): nothing to judge on it
            continue
        migrated = True
    if not migrated:
        return []
    return [
        _no_sweeper(
            "in CELERY_BEAT_SCHEDULE or django_celery_beat's periodic tasks",
            f"Looked for an enabled periodic task in {where}. ",
        )
    ]


@register()
def check_response_size(
    app_configs: Sequence[AppConfig] | None = None, **kwargs: Any
) -> list[CheckMessage]:
    """E007: ``MAX_RESPONSE_BYTES`` is not ``None`` or 1 byte to 1 GB."""
    if "MAX_RESPONSE_BYTES" not in DEFAULTS:
        return []
    value = conf.get("MAX_RESPONSE_BYTES")
    if value is None or (
        isinstance(value, int)
        and not isinstance(value, bool)
        and 1 <= value <= MAX_RESPONSE_BYTES_LIMIT
    ):
        return []
    return [
        Error(
            f"IDEMPOTENCY['MAX_RESPONSE_BYTES'] must be None (no limit) or an integer "
            f"from 1 to {MAX_RESPONSE_BYTES_LIMIT} bytes, not {value!r}.",
            hint="It caps the response body stored for replay (default 1048576, 1 MiB); "
            "larger responses are answered but replay as 410 (docs/robustness.md).",
            id="django_idempotency.E007",
        )
    ]
