"""``POST /items``: validate, one INSERT in ``transaction.atomic()``, 201 with Location.

``POST /items-floor`` is the same view with the least any implementation of the
protocol must add, and none of django_idempotency: a claim committed before the view
runs (its own round trip, so that a concurrent duplicate sees it) and the response
stored in the view's transaction (one more statement). It answers no replay and no
409 body: it is a yardstick for the ``floor`` mode of ``benchmarks/minimal_view.py``.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Callable
from typing import Any

from django.db import connection, transaction
from rest_framework import serializers
from rest_framework.renderers import JSONRenderer
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from django_idempotency.protocol.drf import IdempotentMixin
from django_idempotency.store.sql import PG_PARTITIONED_CLAIM_SQL, complete_call_sql

from .models import FloorRecord, Item


class ItemSerializer(serializers.ModelSerializer[Item]):
    class Meta:
        model = Item
        fields = ["id", "name", "size"]


class ItemCreate(IdempotentMixin, APIView):
    """Keyed requests are idempotent; unkeyed ones run the same code unprotected."""

    def post(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        serializer = ItemSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        with transaction.atomic():
            item = serializer.save()
        return Response(serializer.data, status=201, headers={"Location": f"/items/{item.pk}"})

    def get(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        return Response({"ready": True})


#: The floor's claim: one statement in autocommit (as django_idempotency's claim is); no
#: row when the key is taken.
FLOOR_CLAIM_SQL = f"""
INSERT INTO {FloorRecord._meta.db_table} (principal, key)
VALUES (%s, %s)
ON CONFLICT (principal, key) DO NOTHING
RETURNING id
"""
FLOOR_COMPLETE_SQL = (
    f"UPDATE {FloorRecord._meta.db_table} SET response_status = %s, response_body = %s "
    "WHERE id = %s"
)


class ItemCreatePadded(ItemCreate):
    """``POST /items-padded?pad=N``: ``POST /items`` whose 201 carries N more bytes.

    The response grows by a ``receipt`` of ``N`` random hex characters (default 1000,
    which do not compress), so the stored record is as large as a typical API's
    (benchmarks/fillfactor.py).
    """

    def post(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        response = super().post(request, *args, **kwargs)
        pad = int(request.query_params.get("pad", "1000"))
        response.data = {**response.data, "receipt": os.urandom(pad // 2 + 1).hex()[:pad]}
        return response


def _create_then(request: Request, complete: Callable[[bytes], None]) -> Response:
    """``ItemCreate``'s work, with ``complete(body)`` run in its transaction (the yardsticks)."""
    serializer = ItemSerializer(data=request.data)
    serializer.is_valid(raise_exception=True)
    with transaction.atomic():
        item = serializer.save()
        complete(JSONRenderer().render(serializer.data))
    return Response(serializer.data, status=201, headers={"Location": f"/items/{item.pk}"})


class ItemCreateFloor(APIView):
    """The view of ``ItemCreate`` with a hand-written claim and completion (see above)."""

    def post(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        key = request.headers["Idempotency-Key"]
        with connection.cursor() as cursor:
            cursor.execute(FLOOR_CLAIM_SQL, [str(request.user.pk), key])
            claimed = cursor.fetchone()
            if claimed is None:
                return Response(status=409)
            return _create_then(
                request, lambda body: cursor.execute(FLOOR_COMPLETE_SQL, [201, body, claimed[0]])
            )


class ItemCreateSql(APIView):
    """The view of ``ItemCreate`` with django_idempotency's own SQL and the least Python.

    The claim function and the completion function exactly as the app sends them on the
    partitioned table with owner presence (the view's block commits after the
    completion), but no
    key check, fingerprint, options, signals, wrappers or response snapshot: it shows
    what the app's statements cost apart from its Python (the ``sql`` mode).
    """

    def post(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        scope = {
            "principal": str(request.user.pk),
            "endpoint": "items-sql",
            "key": request.headers["Idempotency-Key"],
        }
        token = uuid.uuid4()
        with connection.cursor() as cursor:
            cursor.execute(
                PG_PARTITIONED_CLAIM_SQL,
                {
                    **scope,
                    "fingerprint": "0" * 64,
                    "token": token,
                    "lease": 30.0,
                    "retention": 86400.0,
                    "clock_offset": 0.0,
                    "take": True,
                    "test": True,
                    "request_path": request.path,
                },
            )
            row = dict(zip([c.name for c in cursor.description], cursor.fetchone(), strict=True))
            won, record_id = row["won"], row["id"]
            if not won:
                return Response(status=409)
            completion = {
                **scope,
                "id": record_id,
                "token": token,
                "status": 201,
                "headers": "[]",
                "grace": 30.0,
                "clock_offset": 0.0,
            }
            sql = complete_call_sql(unlock=True)
            return _create_then(
                request, lambda body: cursor.execute(sql, {**completion, "body": body})
            )
