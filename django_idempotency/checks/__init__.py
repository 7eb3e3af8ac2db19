"""System checks, with stable ids (``django_idempotency.E001``...; docs/checks.md).

``settings`` (the ``IDEMPOTENCY`` setting, the database's isolation level, the
sweeper's schedule), ``databases`` (where records live), ``functions`` (the
server-side functions a database holds are this version's), ``tenants`` (schema-per-tenant
layouts, django-tenants), and the checks of the
idempotent views of the URLconf, read through ``urls``: ``views`` and ``stacking``
(protection stacked where it cannot work). Each module registers its checks when
it is imported; ``apps.IdempotencyConfig.ready`` imports them.
"""
