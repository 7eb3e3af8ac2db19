"""The public surface a project builds on, pinned: names, settings, ids and stored names.

Everything here is something a project imports, writes in its settings, silences, greps
for or finds in its database: a change to any of it breaks projects, so it changes
only on purpose, with this test and the CHANGELOG.
"""

from __future__ import annotations

import ast
import importlib
import re
from pathlib import Path

import pytest
from django.core.management import get_commands
from django.db import connection
from django.utils.module_loading import import_string

import django_idempotency

PACKAGE = Path(django_idempotency.__file__).resolve().parent
DOCS = PACKAGE.parent / "docs"

#: module -> the names a project imports from it (docs/*.md).
NAMES: dict[str, tuple[str, ...]] = {
    "django_idempotency": (
        "IdempotencyContext",
        "IdempotentMixin",
        "ReplayNegotiation",
        "__version__",
        "current",
        "derive_key",
        "idempotent",
    ),
    "django_idempotency.exceptions": (
        "CrossDatabaseWrite",
        "HeartbeatUnavailable",
        "IdempotencyError",
        "InFlight",
        "InvalidKey",
        "KeyReused",
        "LeaseLost",
        "NotInTransaction",
        "OuterTransactionWarning",
        "PhaseError",
        "SignatureRefused",
        "UnstorableResult",
    ),
    "django_idempotency.conf": ("DEFAULTS", "conf"),
    "django_idempotency.models": (
        "IdempotencyRecord",
        "OutboxMessage",
        "OutboxState",
        "RecordState",
    ),
    "django_idempotency.signals": (
        "audited",
        "claimed",
        "completed",
        "executed",
        "execution_near_lease",
        "extended",
        "fenced",
        "in_flight",
        "mismatched",
        "outbox_dead_lettered",
        "outbox_delivered",
        "outbox_failed",
        "released",
        "replay_near_window_end",
        "replayed",
        "store_failed",
        "woken",
    ),
    "django_idempotency.logs": ("connect", "disconnect", "key_hash"),
    "django_idempotency.principals": (
        "auth_token_principal",
        "hmac_signature",
        "sign",
        "signed_principal",
        "user_principal",
    ),
    "django_idempotency.extractors": ("body_field", "combined", "header"),
    "django_idempotency.metrics": (
        "InMemoryMetrics",
        "MetricsSink",
        "OutboxStats",
        "connect",
        "disconnect",
        "outbox_stats",
    ),
    "django_idempotency.outbox": (
        "Relay",
        "autodiscover",
        "deliver_batch",
        "deliver_due",
        "enqueue",
        "get_handler",
        "handler",
        "kick",
        "register",
        "unregister",
    ),
    "django_idempotency.inbox": ("Attempt", "idempotent_call", "once"),
    "django_idempotency.inbox.celery": ("idempotent_shared_task", "idempotent_task"),
    "django_idempotency.retention": ("SweepReport", "sweep", "sweep_all"),
    "django_idempotency.store": ("end_leases", "forget_responses"),
    "django_idempotency.tasks": ("audit_keys_minted", "relay_outbox", "sweep"),
    "django_idempotency.admin": ("IdempotencyRecordAdmin", "OutboxMessageAdmin"),
    "django_idempotency.contrib.openapi": ("IdempotentAutoSchema", "IdempotentSchemaMixin"),
    "django_idempotency.contrib.prometheus": ("install", "uninstall"),
    "django_idempotency.contrib.celery_beat": (
        "DEFAULT_TASKS",
        "PeriodicTaskSpec",
        "add_periodic_tasks",
        "remove_periodic_tasks",
    ),
    "django_idempotency.contrib.browsable": ("IdempotentBrowsableAPIRenderer", "KEY_FIELD"),
    "django_idempotency.testing": (
        "IdempotencyTestMixin",
        "fence_stale_owner",
        "fire_duplicates",
        "past_lease",
        "travel",
    ),
    "django_idempotency.client": (
        "AsyncIdempotentClient",
        "AttemptEvent",
        "Backoff",
        "IdempotentClient",
        "IdempotentRequestError",
        "KeyStore",
        "MemoryKeyStore",
        "NonRetryableError",
        "ResponseNotReplayable",
        "RetriesExhausted",
        "SQLiteKeyStore",
        "is_replay",
        "problem_slug",
        "verdict",
    ),
    "django_idempotency.conformance": (
        "CHECK_NAMES",
        "CheckResult",
        "Config",
        "ConfigError",
        "NonConformance",
        "Report",
        "assert_conforms",
        "run",
    ),
}

#: The keys of the ``IDEMPOTENCY`` setting (docs/configuration.md).
SETTINGS = frozenset(
    {
        "BODY_CODEC", "DATABASES", "DATABASE_RESOLVER", "FINGERPRINT_EXCLUDE",
        "FINGERPRINT_FORM_TOKENS", "FINGERPRINT_HEADERS", "HEARTBEAT", "LEASE",
        "MAX_KEY_LENGTH", "MAX_RESPONSE_BYTES", "MAX_RETENTION", "MAX_WAITERS",
        "OUTBOX_BACKOFF_BASE", "OUTBOX_BACKOFF_CAP", "OUTBOX_BATCH_SIZE", "OUTBOX_KICK",
        "OUTBOX_MARK_DELAY", "OUTBOX_MAX_ATTEMPTS", "OUTBOX_RELAY_LEASE",
        "OUTBOX_RELAY_THREADS", "OUTBOX_RETENTION", "OWNER_PRESENCE", "PARTITIONS_AHEAD",
        "PARTITION_RECORDS", "PRINCIPAL_RESOLVER", "PROBLEM_TYPE_BASE", "RELEASE_PREDICATE",
        "RELEASE_STATUSES", "REPLAY_DENY_HEADERS", "REPLAY_HEADERS", "REQUIRED", "RETENTION",
        "RETRY_AFTER", "SWEEP_BATCH_SIZE", "UNGUARDED_DATABASES", "WAIT",
        "LEASE_WARNING_FRACTION", "RETENTION_WARNING_FRACTION",
    }
)  # fmt: skip

#: System check ids (docs/checks.md): projects silence them by id.
CHECK_IDS = frozenset(
    [f"django_idempotency.E{n:03}" for n in range(1, 14)]
    + [f"django_idempotency.W{n:03}" for n in range(1, 15)]
)

#: Problem type slugs (docs/problems.md): clients branch on them.
PROBLEM_SLUGS = frozenset(
    {
        "body-too-large", "invalid-key", "invalid-signature", "key-reused", "lease-lost",
        "missing-key", "no-principal", "request-in-flight", "response-too-large-to-replay",
        "store-not-set-up", "store-unavailable", "unreadable-body",
    }
)  # fmt: skip

#: Logger names (docs/observability.md): logging configurations name them.
LOGGERS = frozenset(
    {
        "django_idempotency",
        "django_idempotency.client",
        "django_idempotency.events",
        "django_idempotency.metrics",
        "django_idempotency.outbox",
    }
)

#: Dotted paths a project's settings may hold (ours and DRF's / drf-spectacular's).
DOTTED_PATHS = (
    "django_idempotency.principals.user_principal",
    "django_idempotency.principals.auth_token_principal",
    "django_idempotency.ReplayNegotiation",
    "django_idempotency.contrib.openapi.IdempotentAutoSchema",
    "django_idempotency.contrib.browsable.IdempotentBrowsableAPIRenderer",
    "django_idempotency.tasks.relay_outbox",
    "django_idempotency.tasks.sweep",
    "django_idempotency.tasks.audit_keys_minted",
)

TEMPLATES = frozenset(
    {
        "admin/django_idempotency/confirm_action.html",
        "admin/django_idempotency/end_leases.html",
        "admin/django_idempotency/forget_responses.html",
        "django_idempotency/browsable_api.html",
    }
)

SQL_FUNCTIONS = frozenset(
    {
        "django_idempotency_claim",
        "django_idempotency_complete",
        "django_idempotency_record_scope_unique",
    }
)


def _sources() -> list[Path]:
    return sorted(p for p in PACKAGE.rglob("*.py") if "migrations" not in p.parts)


@pytest.mark.parametrize("module", sorted(NAMES))
def test_every_public_name_imports_from_its_module(module: str) -> None:
    """A name of the public surface is importable from the module the docs name."""
    imported = importlib.import_module(module)

    missing = [name for name in NAMES[module] if not hasattr(imported, name)]

    assert missing == [], f"{module} lacks {missing}"


def test_the_public_errors_share_one_base() -> None:
    """``except IdempotencyError`` catches every error of the app."""
    from django_idempotency import exceptions

    errors = [getattr(exceptions, name) for name in NAMES["django_idempotency.exceptions"]]

    assert [
        e.__name__
        for e in errors
        if not issubclass(e, (exceptions.IdempotencyError, Warning))
        and e is not exceptions.IdempotencyError
    ] == []


def test_the_settings_keys_are_pinned() -> None:
    """Every ``IDEMPOTENCY`` key keeps its name; a new one is added here on purpose."""
    from django_idempotency.conf import DEFAULTS

    assert set(DEFAULTS) == SETTINGS


def test_the_check_ids_are_pinned_and_documented() -> None:
    """Each system check id the package emits is one of the pinned, documented ids."""
    emitted = set()
    for path in _sources():
        emitted.update(re.findall(r"django_idempotency\.[EW]\d{3}", path.read_text()))
    documented = set(re.findall(r"django_idempotency\.[EW]\d{3}", (DOCS / "checks.md").read_text()))

    assert emitted == CHECK_IDS
    assert documented >= CHECK_IDS


def test_the_problem_slugs_are_pinned_and_documented() -> None:
    """Each problem type slug the package answers with is pinned and documented."""
    answered = set()
    for path in _sources():
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if (
                isinstance(node, ast.Call)
                and getattr(node.func, "id", getattr(node.func, "attr", "")) == "ProblemType"
                and node.args
                and isinstance(node.args[0], ast.Constant)
            ):
                answered.add(node.args[0].value)
    documented = (DOCS / "problems.md").read_text()

    assert answered == PROBLEM_SLUGS
    assert [slug for slug in PROBLEM_SLUGS if f"#{slug}" not in documented] == []


def test_the_logger_names_are_pinned() -> None:
    """The package logs on the pinned logger names only."""
    used = set()
    for path in _sources():
        used.update(re.findall(r'getLogger\("([^"]+)"\)', path.read_text()))

    assert used == LOGGERS


@pytest.mark.parametrize("path", DOTTED_PATHS)
def test_dotted_paths_in_settings_resolve(path: str) -> None:
    """A dotted path a project's settings may name still imports."""
    assert import_string(path) is not None


def test_the_celery_task_names_are_pinned() -> None:
    """Beat schedules name the tasks; their names never change."""
    from django_idempotency import tasks

    assert (tasks.relay_outbox.name, tasks.sweep.name, tasks.audit_keys_minted.name) == (
        "django_idempotency.relay_outbox",
        "django_idempotency.sweep",
        "django_idempotency.audit_keys_minted",
    )


def test_the_management_commands_are_pinned() -> None:
    """Operators' scripts and cron lines call these commands."""
    commands = get_commands()

    assert {name for name, app in commands.items() if app == "django_idempotency"} == {
        "idempotency_audit",
        "idempotency_records",
        "idempotency_relay",
        "idempotency_sweep",
    }


def test_the_table_names_are_pinned() -> None:
    """Operators' SQL, dashboards and backups name the tables."""
    from django_idempotency.models import IdempotencyRecord, OutboxMessage

    assert (IdempotencyRecord._meta.db_table, OutboxMessage._meta.db_table) == (
        "django_idempotency_record",
        "django_idempotency_outbox",
    )
    # The store's SQL names the record table once; it is the model's.
    from django_idempotency.store.sql import TABLE

    assert IdempotencyRecord._meta.db_table == TABLE


def test_the_admin_templates_are_pinned() -> None:
    """Projects override the admin's templates (and the browsable API page's) by these
    paths."""
    root = PACKAGE / "templates"

    assert {p.relative_to(root).as_posix() for p in root.rglob("*.html")} == TEMPLATES


@pytest.mark.postgres
@pytest.mark.django_db
def test_the_sql_function_names_are_pinned() -> None:
    """The server-side functions the migrations install keep their names."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT proname FROM pg_proc WHERE proname LIKE 'django_idempotency%%'")
        installed = {row[0] for row in cursor.fetchall()}

    assert installed == SQL_FUNCTIONS
