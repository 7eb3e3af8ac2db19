"""URLs: the API under /v1/, the billing webhook receiver, the Django admin under /admin/."""

from __future__ import annotations

from django.contrib import admin
from django.urls import include, path

from workers.billing import billing_webhook

urlpatterns = [
    path("admin/", admin.site.urls),
    path("v1/", include("workers.urls")),
    path("hooks/billing", billing_webhook, name="billing-webhook"),
]
