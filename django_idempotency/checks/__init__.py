"""System checks, with stable ids (``django_idempotency.E001``...; docs/checks.md).

``settings`` (the ``IDEMPOTENCY`` setting, the database's isolation level, the
sweeper's schedule), ``databases`` (where records live) and ``views`` (the idempotent
views of the URLconf, read through ``urls``). Each module registers its checks when
it is imported; ``apps.IdempotencyConfig.ready`` imports them.
"""
