"""What the app knows and does about the transactions a view runs in.

* ``state``: the view's transaction as the app sees it without a round trip: doomed
  (``set_rollback(True)``, an aborted PostgreSQL transaction), inside an outer block
  the app did not open (``atomic``, ``doomed``, ``outer_block``, ``warn_outer``,
  re-exported here);
* ``write_guard``: writes to another database than the record's, refused while a
  single-transaction view runs.
"""

from __future__ import annotations

from django_idempotency.transactions.state import (
    atomic,
    doomed,
    outer_block,
    reset_warnings,
    warn_outer,
)

__all__ = ["atomic", "doomed", "outer_block", "reset_warnings", "warn_outer"]
