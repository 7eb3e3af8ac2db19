"""``python -m django_idempotency.conformance``: the ``idempotency-conformance`` command."""

from __future__ import annotations

import sys

from django_idempotency.conformance.cli import main

sys.exit(main())
