"""The test API mounted with ``contrib.ninja.api_urls``, for ``ATOMIC_REQUESTS``."""

from __future__ import annotations

from django.urls import path

from django_idempotency.contrib.ninja import api_urls
from tests.support.ninja_api import api

urlpatterns = [path("ninja/", api_urls(api))]
