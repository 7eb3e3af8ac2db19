"""The claim's statements through the ORM (:class:`PortableRecords`): SQLite and the rest."""

from __future__ import annotations

import datetime as dt
import uuid

from django.db import IntegrityError, transaction
from django.db.models import F, Q
from django.db.models.functions import Greatest

from django_idempotency.exceptions import LeaseLost
from django_idempotency.models import IdempotencyRecord, RecordState
from django_idempotency.store import clock
from django_idempotency.store.records.base import RecordStore, fenced, taken_over
from django_idempotency.store.rows import fetch, now_value, scope_filter
from django_idempotency.store.values import Claim, Existing, Headers, Scope


class PortableRecords(RecordStore):
    """The claim through the ORM; see :class:`RecordStore` for each method.

    An insert in a short transaction against the unique constraint, then a read; the
    takeover and the forgetting are conditional ``UPDATE`` and ``DELETE`` statements, and
    the completion and the heartbeat ``UPDATE`` statements fenced by the owner token (the
    heartbeat joins the caller's transaction: SQLite has one writer per database). No
    owner presence: the lease alone ends a claim.
    """

    def insert(
        self,
        scope: Scope,
        fingerprint: str,
        token: uuid.UUID,
        *,
        lease: float,
        retention: float,
        request_path: str,
    ) -> Claim | Existing | None:
        """A read first (outside a transaction), then an insert in a savepoint."""
        connection = self.connection
        if not connection.in_atomic_block:
            # Look before writing: a duplicate of a held key then only reads. On SQLite
            # a write takes the database's one write lock, and a view that has read in
            # its transaction fails at once, whatever the busy timeout, if it then
            # writes while another connection holds that lock
            # (https://www.sqlite.org/lang_transaction.html); a duplicate that reads
            # waits for nothing and does not fail the view it duplicates.
            existing = fetch(scope, using=self.using)
            if existing is not None:
                return existing
        now = clock.app_now()
        window_end = now + dt.timedelta(seconds=max(retention, lease))
        try:
            with transaction.atomic(using=self.using):
                record = IdempotencyRecord.objects.using(self.using).create(
                    **scope_filter(scope),
                    fingerprint=fingerprint,
                    request_path=request_path,
                    owner_token=token,
                    lease_until=clock.to_db(now + dt.timedelta(seconds=lease), connection),
                    created_at=clock.to_db(now, connection),
                    expires_at=clock.to_db(window_end, connection),
                    sweep_after=clock.to_db(window_end, connection),
                )
        except IntegrityError:
            return fetch(scope, using=self.using)
        return Claim(scope, record.pk, token, False, "", self.using, lease=lease)

    def take_over(
        self, scope: Scope, record: Existing, token: uuid.UUID, *, lease: float, cause: str
    ) -> Claim | None:
        """A conditional ``UPDATE``: the lease over, the record as it was read."""
        new_lease_until = now_value(self.using, lease)
        updated = (
            IdempotencyRecord.objects.using(self.using)
            .filter(
                pk=record.record_id,
                state=RecordState.CLAIMED,
                owner_token=record.owner_token,  # type: ignore[misc]  # set on every row read
                recovery_point=record.recovery_point,
                lease_until__lte=now_value(self.using),
            )
            .update(
                owner_token=token,
                lease_until=new_lease_until,
                expires_at=Greatest(F("expires_at"), new_lease_until),
            )
        )
        if updated != 1:
            return None
        return taken_over(scope, record, token, self.using, lease=lease, cause=cause)

    def forget(self, record: Existing) -> None:
        """A conditional ``DELETE``: past the window and the lease, as it was read."""
        now = now_value(self.using)
        IdempotencyRecord.objects.using(self.using).filter(
            Q(state=RecordState.COMPLETED) | Q(lease_until__lte=now),
            pk=record.record_id,
            owner_token=record.owner_token,  # type: ignore[misc]  # set on every row read
            expires_at__lte=now,
        )._raw_delete(self.using)

    def complete(self, claim: Claim, status: int, headers: Headers, body: bytes | None) -> None:
        """A fenced ``UPDATE``; its row count says whether the claim was still ours."""
        now = now_value(self.using)
        updated = fenced(claim).update(
            state=RecordState.COMPLETED,
            response_status=status,
            response_headers=[list(pair) for pair in headers],
            response_body=body,
            completed_at=now,
            lease_until=now,
            expires_at=Greatest(F("expires_at"), now_value(self.using, claim.lease)),
        )
        if updated != 1:
            raise LeaseLost(f"record {claim.record_id}: the lease was lost before completion")

    def extend(self, claim: Claim, seconds: float) -> bool:
        """A fenced ``UPDATE`` in the caller's transaction, if one is open."""
        until = now_value(self.using, seconds)
        return bool(
            fenced(claim).update(lease_until=until, expires_at=Greatest(F("expires_at"), until))
        )
