"""Optional integrations, each behind an extra (``pip install django-idempotency[...]``)."""
