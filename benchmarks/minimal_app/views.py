"""``POST /items``: validate, one INSERT in ``transaction.atomic()``, 201 with Location."""

from __future__ import annotations

from typing import Any

from django.db import transaction
from rest_framework import serializers
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from django_idempotency.drf import IdempotentMixin

from .models import Item


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
