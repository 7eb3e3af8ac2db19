"""WSGI entry point of the minimal-view benchmark's server."""

from __future__ import annotations

import os

from django.core.wsgi import get_wsgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "minimal_app.settings")
application = get_wsgi_application()

if os.environ.get("BENCH_WITHOUT"):  # benchmarks/mechanisms.py: one mechanism off
    from minimal_app.without import apply

    apply(os.environ["BENCH_WITHOUT"])
