from __future__ import annotations

from django.contrib import admin

from .models import Lease, Worker


class LeaseInline(admin.TabularInline):
    model = Lease
    extra = 0
    readonly_fields = ["owner", "created_at", "expires_at"]


@admin.register(Worker)
class WorkerAdmin(admin.ModelAdmin):
    list_display = ["id", "owner", "image", "cpu", "memory_gb", "state", "reboots", "created_at"]
    list_filter = ["state", "image"]
    search_fields = ["id", "owner__username", "image"]
    readonly_fields = ["id", "created_at"]
    inlines = [LeaseInline]


@admin.register(Lease)
class LeaseAdmin(admin.ModelAdmin):
    list_display = ["worker", "owner", "created_at", "expires_at"]
    search_fields = ["worker__id", "owner__username"]
