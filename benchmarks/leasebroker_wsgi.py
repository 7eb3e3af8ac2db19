"""leasebroker's WSGI application with ``BENCH_WITHOUT`` applied, for ``mechanisms.py``.

``mechanisms.py --app leasebroker`` runs the example project's create on gunicorn from
``example_project/``, as ``http_bench.py`` does, through this module instead of
``leasebroker.wsgi``, so that server B can turn one speed mechanism off
(``minimal_app/without.py``) once Django is set up, as ``minimal_app/wsgi.py`` does.
"""

from __future__ import annotations

import os

from leasebroker.wsgi import application

if os.environ.get("BENCH_WITHOUT"):  # benchmarks/mechanisms.py: one mechanism off
    from minimal_app.without import apply

    apply(os.environ["BENCH_WITHOUT"])

__all__ = ["application"]
