"""Optional integrations, each behind an extra (``pip install django-idempotency[...]``).

``browsable`` needs no extra (DRF only): DRF's browsable API with a key in its forms.
"""
