"""JSON in and out of the workers API."""

from __future__ import annotations

from typing import Any

from rest_framework import serializers

from .models import Worker

MAX_LABELS = 32


class WorkerSerializer(serializers.ModelSerializer):
    """A worker as the API shows it; ``image``, ``cpu``, ``memory_gb``, ``labels`` in."""

    cpu = serializers.IntegerField(min_value=1, max_value=64)
    memory_gb = serializers.IntegerField(min_value=1, max_value=512)
    labels = serializers.DictField(
        child=serializers.CharField(max_length=200, allow_blank=True), required=False
    )
    owner = serializers.CharField(source="owner.username", read_only=True)
    lease_expires_at = serializers.SerializerMethodField()

    class Meta:
        model = Worker
        fields = [
            "id",
            "owner",
            "image",
            "cpu",
            "memory_gb",
            "labels",
            "state",
            "reboots",
            "vm_id",
            "created_at",
            "lease_expires_at",
        ]
        read_only_fields = ["id", "owner", "state", "reboots", "vm_id", "created_at"]

    def validate_image(self, value: str) -> str:
        if not value.strip():
            raise serializers.ValidationError("An image name is required, e.g. ubuntu-24.04.")
        return value.strip()

    def validate_labels(self, value: dict[str, Any]) -> dict[str, Any]:
        if len(value) > MAX_LABELS:
            raise serializers.ValidationError(f"At most {MAX_LABELS} labels.")
        if any(not key or len(key) > 63 for key in value):
            raise serializers.ValidationError("Label names are 1 to 63 characters.")
        return value

    def get_lease_expires_at(self, worker: Worker) -> str | None:
        lease = worker.leases.order_by("-expires_at").first()
        return serializers.DateTimeField().to_representation(lease.expires_at) if lease else None
