"""``store.operators.with_key_hash``: records found by the ``key_hash`` of a log line.

The ``idempotency_records --key-hash`` command is tested in tests/test_operator_command.py.
"""

from __future__ import annotations

import pytest

from django_idempotency import store
from django_idempotency.logs import key_hash
from django_idempotency.models import IdempotencyRecord
from django_idempotency.store import operators

pytestmark = pytest.mark.django_db

#: Printable ASCII keys, quotes, backslash and spaces included.
KEYS = ("8e03978e-5a1c-4b7e-9d1f-0c2b3a4d5e6f", "a b", 'it\'s "quoted" \\ ~', "Z" * 255)


def test_with_key_hash_finds_exactly_the_records_whose_key_has_that_hash():
    """Every key is found by its ``logs.key_hash`` (on PostgreSQL the hash is computed
    in SQL and must equal the logs'), the queryset's own filter is kept, and a hash no
    key has finds nothing."""
    for key in KEYS:
        for principal in ("auth.user:7", "auth.user:8"):
            scope = store.Scope(principal, "POST /jobs", key)
            assert isinstance(
                store.claim(scope, "f" * 64, lease=30.0, retention=3600.0), store.Claim
            )
    mine = IdempotencyRecord.objects.using("default").filter(principal="auth.user:7")
    for key in KEYS:
        found = operators.with_key_hash(mine, key_hash(key))
        assert [(r.principal, r.key) for r in found] == [("auth.user:7", key)]
    every = IdempotencyRecord.objects.using("default").all()
    assert operators.with_key_hash(every, key_hash(KEYS[0])).count() == 2
    assert not operators.with_key_hash(every, "000000000000").exists()
