"""Settings of a server process serving ``tests.support.ninja_api`` over real HTTP.

The suite's settings, on the test database the running pytest session created (so the
server and the test see the same rows); ``DATABASE_URL`` chooses the backend as it does
for the suite. ``tests.support.ninja_wsgi`` is the application gunicorn serves
(``test_ninja_http.py``).
"""

from __future__ import annotations

from tests.settings import *  # noqa: F403
from tests.settings import DATABASES as _SUITE_DATABASES

DATABASES = {
    "default": {
        **_SUITE_DATABASES["default"],
        "NAME": _SUITE_DATABASES["default"]["TEST"]["NAME"],
    }
}
ROOT_URLCONF = "tests.support.ninja_api"
