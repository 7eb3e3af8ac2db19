"""The WSGI application of ``tests.support.ninja_server``'s settings, for gunicorn."""

from __future__ import annotations

import os

from django.core.wsgi import get_wsgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tests.support.ninja_server")
application = get_wsgi_application()
