"""Helpers of ``storm.py``, the retry-storm demo: a fault-injecting proxy, the server
and its throwaway database, the storm's clients and the crash scenario."""

from __future__ import annotations

import sys
from pathlib import Path

# Use django_idempotency from this repository even if it is not pip-installed, as
# leasebroker/settings.py does (`pip install -e ".[example,client]"` is the proper way).
_REPO = Path(__file__).resolve().parent.parent.parent
if (_REPO / "django_idempotency").is_dir() and str(_REPO) not in sys.path:
    sys.path.append(str(_REPO))
