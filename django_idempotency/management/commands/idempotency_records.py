"""``manage.py idempotency_records``: look up records, end leases, forget responses.

For operators without the admin (docs/operations.md). Records are found by principal,
endpoint, request path, key or key hash (the ``key_hash`` the log lines carry), and by
condition; each is printed with its path, its condition, its times to the second in UTC
with relative text, and its stored response's status, content type and size (the body
only with ``--body``). ``--end-lease`` and ``--forget-response`` do what the admin's actions do,
with the same functions (``store.end_leases``, ``store.forget_responses``).
"""

from __future__ import annotations

import datetime as dt
import re
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db import connections
from django.db.models import QuerySet

from django_idempotency.logs import key_hash
from django_idempotency.models import IdempotencyRecord, RecordState
from django_idempotency.store import clock, operators
from django_idempotency.store.routing import record_database
from django_idempotency.store.values import decode_body

_HASH = re.compile(r"[0-9a-f]{12}")
_CONDITIONS = {"in-flight": operators.IN_FLIGHT, "abandoned": operators.ABANDONED}
_CONDITIONS["completed"] = operators.COMPLETED


class Command(BaseCommand):
    """Print the matching records; end their leases or forget their responses."""

    help = (
        "Look up idempotency records by principal, endpoint, key or key hash (the "
        "key_hash of the log lines) and print each with its condition (in flight, "
        "abandoned, completed), its times and its stored response's size; the body "
        "only with --body. --end-lease ends the live leases of the claimed records "
        "printed (the next retry takes each over); --forget-response deletes the "
        "completed records printed (the next request with each key runs the view "
        "again, a second time). Both act at once, as the admin's actions do once "
        "confirmed, and need at least one of --principal, --endpoint, --path, --key, "
        "--key-hash."
    )

    def add_arguments(self, parser: CommandParser) -> None:  # noqa: D102
        parser.add_argument("--principal", help="Exactly this principal (auth.user:42).")
        parser.add_argument("--endpoint", help='Exactly this endpoint ("POST /v1/orders").')
        parser.add_argument(
            "--path", help="Exactly this request path (/v1/orders/42/cancel), as sent."
        )
        parser.add_argument("--key", help="Exactly this Idempotency-Key.")
        parser.add_argument(
            "--key-hash",
            help="The key whose key_hash (12 hexadecimal digits, as logged) is this.",
        )
        parser.add_argument(
            "--condition", choices=tuple(_CONDITIONS), help="Only records in this condition."
        )
        parser.add_argument(
            "--database",
            default=None,
            choices=tuple(connections),
            help="Database alias (default: the router's choice for writing records).",
        )
        parser.add_argument(
            "--limit",
            type=int,
            default=50,
            help="Print at most this many, newest first; --end-lease and --forget-response "
            "act on those printed only.",
        )
        parser.add_argument(
            "--body", action="store_true", help="Print each stored body as a replay sends it."
        )
        action = parser.add_mutually_exclusive_group()
        action.add_argument(
            "--end-lease",
            action="store_true",
            help="End the live leases of the claimed records printed, now.",
        )
        action.add_argument(
            "--forget-response",
            action="store_true",
            help="Delete the completed records printed: their keys run the view again.",
        )

    def handle(self, *args: Any, **options: Any) -> None:  # noqa: D102
        using = options["database"] or record_database()
        if options["limit"] < 1:
            raise CommandError("--limit must be at least 1.")
        records = self._matching(using, options)
        acting = options["end_lease"] or options["forget_response"]
        lookups = ("principal", "endpoint", "path", "key", "key_hash")
        if acting and not any(options[name] for name in lookups):
            raise CommandError(
                "--end-lease and --forget-response need --principal, --endpoint, --path, "
                "--key or --key-hash: they never act on every record."
            )
        found = list(records.order_by("-created_at")[: options["limit"]])
        now = clock.store_now(connections[using])
        for record in found:
            self._print(record, now, options["body"])
        shown = len(found)
        self.stdout.write(f"{shown} record{'s' if shown != 1 else ''} found.")
        if not acting or not found:
            return
        ids = [record.pk for record in found]  # only those printed (--limit)
        if options["end_lease"]:
            count = operators.end_leases(ids, using=using)
            done = (
                f"Ended {count} lease{'s' if count != 1 else ''}: the next retry with each "
                "key takes it over."
            )
            none = "No lease was ended: none of the records found has a live lease."
            why = "no live lease (completed, or the lease has run out or was ended already)"
        else:
            count = operators.forget_responses(ids, using=using)
            done = (
                f"Forgot {count} stored response{'s' if count != 1 else ''}: the next "
                "request with each key runs the view again."
            )
            none = "No stored response was forgotten: none of the records found is completed."
            why = "not completed (a claim's lease can be ended instead)"
        self.stdout.write(done if count else none)
        if shown - count:
            self.stdout.write(f"Left alone {shown - count}: {why}.")

    def _matching(self, using: str, options: dict[str, Any]) -> QuerySet[Any]:
        """The records the options select, annotated for their condition.

        Raises:
            CommandError: ``--key-hash`` is not 12 hexadecimal digits.
        """
        records = IdempotencyRecord.objects.using(using).all()
        for name, field in (
            ("principal", "principal"),
            ("endpoint", "endpoint"),
            ("path", "request_path"),
            ("key", "key"),
        ):
            if options[name]:
                records = records.filter(**{field: options[name]})
        wanted = options["key_hash"]
        if wanted:
            wanted = wanted.strip().lower()
            if not _HASH.fullmatch(wanted):
                raise CommandError("--key-hash is the 12 hexadecimal digits of a log line.")
            records = operators.with_key_hash(records, wanted)
        records = operators.with_condition(records)
        if options["condition"]:
            records = operators.only_condition(records, _CONDITIONS[options["condition"]])
        return records

    def _print(self, record: IdempotencyRecord, now: dt.datetime, body: bool) -> None:
        connection = connections[record._state.db or "default"]

        def when(value: dt.datetime | None, text: str = "{}") -> str:
            if value is None:
                return "-"
            moment = clock.from_db(value, connection)
            return (
                f"{moment:%Y-%m-%d %H:%M:%S} UTC ({text.format(operators.relative(moment, now))})"
            )

        condition = operators.condition_of(record, now)
        lease_until = clock.from_db(record.lease_until, connection)
        if lease_until > now:
            lease_text = "lease ends {}"
        elif record.lease_until == record.created_at:
            lease_text = "lease ended by an operator {}"
        else:
            lease_text = "lease ended {}"
        if condition == operators.ABANDONED and getattr(record, "owner_gone", False):
            condition += ", the owner's session is gone"
        if record.recovery_point:
            condition += f", after phase {record.recovery_point}"
        expires = clock.from_db(record.expires_at, connection)
        expires_text = "expires {}" if expires > now else "expired {}"
        lines = [
            f"#{record.pk} {record.principal} {record.endpoint} key {record.key!r} "
            f"(key_hash {key_hash(record.key)})",
            f"  path:        {record.request_path or '-'}",
            f"  condition:   {condition}",
            f"  created:     {when(record.created_at)}",
            f"  lease until: {when(record.lease_until, lease_text)}",
            f"  completed:   {when(record.completed_at, 'completed {}')}",
            f"  expires:     {when(record.expires_at, expires_text)}",
        ]
        lines.extend(self._response(record, body))
        self.stdout.write("\n".join(lines))

    @staticmethod
    def _response(record: IdempotencyRecord, body: bool) -> list[str]:
        """The stored response's lines: status, content type, size (and the body)."""
        if record.state != RecordState.COMPLETED:
            return []
        content_type = next(
            (v for n, v in record.response_headers or () if n.lower() == "content-type"), ""
        )
        head = f"  response:    {record.response_status}, {content_type or 'no Content-Type'}"
        if record.response_body is None:
            return [f"{head}, body not kept (larger than MAX_RESPONSE_BYTES)"]
        try:
            data = decode_body(record.response_body)
        except Exception as exc:  # the codec's own errors (a removed key, corrupt data)
            return [f"{head}, body cannot be decoded by BODY_CODEC: {exc}"]
        lines = [f"{head}, {len(data)} byte{'s' if len(data) != 1 else ''}"]
        if body:
            text = _text(data, content_type)
            if text is None:
                lines.append("  body: not text; download it from the record's admin page")
            else:
                lines.append(text)
        return lines


def _text(data: bytes, content_type: str) -> str | None:
    """``data`` decoded with the ``charset`` of ``content_type`` (else UTF-8), or ``None``."""
    charset = "utf-8"
    for param in content_type.split(";")[1:]:
        name, _sep, value = param.partition("=")
        if name.strip().lower() == "charset" and value.strip():
            charset = value.strip().strip('"')
    try:
        return data.decode(charset)
    except (LookupError, UnicodeDecodeError):
        return None
