from __future__ import annotations

import pytest
from django.conf import settings
from django.core import checks
from django.test import override_settings

from django_idempotency.checks.settings import check_settings


def ids(messages):
    return [m.id for m in messages]


def test_default_settings_are_clean():
    assert check_settings() == []


@override_settings(IDEMPOTENCY=["not", "a", "dict"])
def test_e001_not_a_dict():
    assert ids(check_settings()) == ["django_idempotency.E001"]


@override_settings(IDEMPOTENCY={"LEASE_SECONDS": 5})
def test_e001_unknown_key():
    (message,) = check_settings()
    assert message.id == "django_idempotency.E001" and "LEASE_SECONDS" in message.msg


@pytest.mark.parametrize("value", [0, 256, "x"])
def test_e002_max_key_length(value):
    with override_settings(IDEMPOTENCY={"MAX_KEY_LENGTH": value}):
        assert ids(check_settings()) == ["django_idempotency.E002"]


@pytest.mark.parametrize(
    "values",
    [{"LEASE": 0}, {"RETENTION": -1}, {"WAIT": -1}, {"LEASE": 100, "RETENTION": 50}],
)
def test_e003_durations(values):
    with override_settings(IDEMPOTENCY=values):
        assert ids(check_settings()) == ["django_idempotency.E003"]


def test_e003_names_the_values_that_clash():
    with override_settings(IDEMPOTENCY={"LEASE": 100, "RETENTION": 50}):
        (message,) = check_settings()
    assert message.msg == (
        "IDEMPOTENCY['LEASE'] (100 s) must be shorter than IDEMPOTENCY['RETENTION'] (50 s)."
    )
    with override_settings(IDEMPOTENCY={"LEASE": "soon"}):
        (message,) = check_settings()
    assert "(they are 'soon', 86400" in message.msg, message.msg


@pytest.mark.parametrize("name", ["LEASE_WARNING_FRACTION", "RETENTION_WARNING_FRACTION"])
@pytest.mark.parametrize("value", [0, 1.5, -0.2, "most"])
def test_e013_a_warning_fraction_outside_0_to_1(name, value):
    with override_settings(IDEMPOTENCY={name: value}):
        (message,) = check_settings()
    assert message.id == "django_idempotency.E013" and name in message.msg


@override_settings(IDEMPOTENCY={"REPLAY_HEADERS": ["X-Version", "Set-Cookie", "traceparent"]})
def test_e004_forbidden_replay_headers():
    (message,) = check_settings()
    assert message.id == "django_idempotency.E004"
    assert "Set-Cookie" in message.msg and "traceparent" in message.msg
    assert "X-Version" not in message.msg


@override_settings(IDEMPOTENCY={"PRINCIPAL_RESOLVER": "no.such.module.resolver"})
def test_e005_unimportable_resolver():
    assert ids(check_settings()) == ["django_idempotency.E005"]


def test_checks_are_registered():
    registered = checks.registry.registry.get_checks()
    names = {c.__name__ for c in registered}
    assert {"check_settings", "check_atomic_requests"} <= names


# --- W003, W004, E007 (production readiness) ---------------------------------------

from django.db import connection  # noqa: E402

from django_idempotency.checks.settings import (  # noqa: E402
    SWEEP_TASK,
    check_production_database,
    check_response_size,
    check_sweeper_scheduled,
    check_sweeper_scheduled_in_database,
)


@pytest.fixture
def outside_tests(monkeypatch):
    """As in production: no test environment (its email outbox) set up."""
    from django.core import mail

    monkeypatch.delattr(mail, "outbox", raising=False)


def test_w003_is_silent_under_the_test_runner():
    """Django's test environment forces DEBUG = False: W003 does not fire there."""
    from django.core import mail

    assert hasattr(mail, "outbox")  # pytest-django set up the test environment
    with override_settings(DEBUG=False):
        assert check_production_database() == []


def test_w003_non_postgresql_database_in_production(outside_tests):
    with override_settings(DEBUG=False):
        messages = check_production_database()
    if connection.vendor == "postgresql":
        assert messages == []
    else:
        (message,) = messages
        assert message.id == "django_idempotency.W003"
        assert "'default'" in message.msg and connection.vendor in message.msg
        assert "SILENCED_SYSTEM_CHECKS" in message.hint
        with override_settings(SILENCED_SYSTEM_CHECKS=["django_idempotency.W003"]):
            assert message.is_silenced()
    with override_settings(DEBUG=True):
        assert check_production_database() == []


#: The test settings without django-celery-beat (installed where it supports Django).
WITHOUT_BEAT = [app for app in settings.INSTALLED_APPS if app != "django_celery_beat"]


@override_settings(INSTALLED_APPS=WITHOUT_BEAT)
def test_w004_no_sweeper_scheduled():
    with override_settings(DEBUG=False, CELERY_BEAT_SCHEDULE={}):
        (message,) = check_sweeper_scheduled()
        assert message.id == "django_idempotency.W004" and SWEEP_TASK in message.msg
        with override_settings(SILENCED_SYSTEM_CHECKS=["django_idempotency.W004"]):
            assert message.is_silenced()
    scheduled = {"idempotency-sweep": {"task": SWEEP_TASK, "schedule": 3600.0}}
    with override_settings(DEBUG=False, CELERY_BEAT_SCHEDULE=scheduled):
        assert check_sweeper_scheduled() == []
    with override_settings(DEBUG=True, CELERY_BEAT_SCHEDULE={}):
        assert check_sweeper_scheduled() == []
    # without django_celery_beat there is no database schedule to look at
    with override_settings(DEBUG=False, CELERY_BEAT_SCHEDULE={}):
        assert check_sweeper_scheduled_in_database(databases=["default"]) == []


@pytest.mark.parametrize("value", [0, -1, "1MB", 1.5, True, 2**30])
def test_e007_max_response_bytes_out_of_range(value):
    with override_settings(IDEMPOTENCY={"MAX_RESPONSE_BYTES": value}):
        assert ids(check_response_size()) == ["django_idempotency.E007"]


@pytest.mark.parametrize("value", [None, 1, 1024 * 1024, 2**30 - 1])
def test_e007_max_response_bytes_in_range(value):
    with override_settings(IDEMPOTENCY={"MAX_RESPONSE_BYTES": value}):
        assert check_response_size() == []


def test_production_checks_are_registered():
    names = {
        c.__name__ for c in checks.registry.registry.get_checks(include_deployment_checks=True)
    }
    assert {
        "check_production_database",
        "check_sweeper_scheduled",
        "check_sweeper_scheduled_in_database",
        "check_response_size",
    } <= names


# --- W005 (transaction.atomic above @idempotent) -----------------------------------

from django.db import transaction  # noqa: E402
from django.utils.decorators import method_decorator  # noqa: E402
from rest_framework.decorators import api_view  # noqa: E402
from rest_framework.response import Response  # noqa: E402
from rest_framework.views import APIView  # noqa: E402

from django_idempotency import IdempotentMixin, idempotent  # noqa: E402
from django_idempotency.checks.views import _outer_atomic, check_outer_atomic  # noqa: E402


def test_w005_atomic_above_idempotent_in_the_urlconf():
    messages = check_outer_atomic()
    assert ids(messages) == ["django_idempotency.W005"] * len(messages)
    flagged = {m.obj.__name__ for m in messages}
    # @api_view above @transaction.atomic above @idempotent, and a plain function view.
    assert flagged == {"atomic_above", "atomic_above_plain"}
    assert all("below @idempotent" in m.hint for m in messages)
    assert any(
        m.msg.startswith("tests.support.testapp.views.atomic_above is idempotent") for m in messages
    )


def _view(request):
    return Response({})


class _Reboot(APIView):
    @idempotent
    def post(self, request):
        return Response({})


@method_decorator(transaction.atomic, name="dispatch")
class _AtomicDispatch(_Reboot):
    pass


@method_decorator(transaction.atomic, name="dispatch")
class _AtomicMixinDispatch(IdempotentMixin, APIView):
    def post(self, request):
        return Response({})


class _AtomicHandler(APIView):
    @method_decorator(transaction.atomic(using="default"))
    @idempotent
    def post(self, request):
        return Response({})


class _HandlerAtomicBelow(APIView):
    @idempotent
    @method_decorator(transaction.atomic)
    def post(self, request):
        return Response({})


@pytest.mark.parametrize(
    ("callback", "where"),
    [
        (transaction.atomic(idempotent(_view)), "the view function"),
        (api_view(["POST"])(transaction.atomic(idempotent(_view))), "its post method"),
        (transaction.atomic(api_view(["POST"])(idempotent(_view))), "as_view()"),
        (transaction.atomic(_Reboot.as_view()), "as_view()"),
        (_AtomicDispatch.as_view(), "its dispatch method"),
        (_AtomicMixinDispatch.as_view(), "its dispatch method"),
        (_AtomicHandler.as_view(), "its post method"),
    ],
)
def test_w005_sees_atomic_decorators_above_the_claim(callback, where):
    found = _outer_atomic(callback)
    assert found is not None and where in found[1]


@pytest.mark.parametrize(
    "callback",
    [
        idempotent(transaction.atomic(_view)),
        idempotent(_view),
        idempotent(api_view(["POST"])(transaction.atomic(_view))),
        api_view(["POST"])(idempotent(transaction.atomic(_view))),
        transaction.atomic(_view),  # not idempotent: nothing to say
        _Reboot.as_view(),
        _HandlerAtomicBelow.as_view(),
        transaction.non_atomic_requests(idempotent(_view)),
    ],
)
def test_w005_silent_without_atomic_above_the_claim(callback):
    assert _outer_atomic(callback) is None


def test_w006_only_above_read_committed(db):
    from django.db import connection

    from django_idempotency.checks.settings import check_isolation_level

    assert check_isolation_level() == []
    if connection.vendor != "postgresql":
        return  # the setting means nothing elsewhere: the check stays silent
    from django.db.backends.postgresql.psycopg_any import IsolationLevel

    options = connection.settings_dict.setdefault("OPTIONS", {})
    options["isolation_level"] = IsolationLevel.REPEATABLE_READ
    try:
        (message,) = check_isolation_level()
    finally:
        del options["isolation_level"]
    assert message.id == "django_idempotency.W006" and "HeartbeatUnavailable" in message.msg


# --- W009 (the URLconf cannot be read): every check still runs ----------------------

import os  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
from io import StringIO  # noqa: E402
from pathlib import Path  # noqa: E402

from django.conf import settings as django_settings  # noqa: E402
from django.core.management import call_command  # noqa: E402
from django.urls import clear_url_caches  # noqa: E402


def _our_checks() -> list:
    return [
        check
        for check in checks.registry.registry.get_checks(include_deployment_checks=True)
        if check.__module__.startswith("django_idempotency.")
    ]


def test_check_runs_without_a_root_urlconf():
    """A worker's settings module has no ``ROOT_URLCONF``: ``manage.py check`` runs every
    check and reports nothing about views (there are none to inspect)."""
    out = StringIO()
    with override_settings():
        del django_settings.ROOT_URLCONF
        clear_url_caches()
        try:
            call_command("check", stdout=out, stderr=StringIO())
            messages = [m for check in _our_checks() for m in check(app_configs=None)]
        finally:
            clear_url_caches()
    assert "System check identified no issues" in out.getvalue(), out.getvalue()
    assert "django_idempotency.W009" not in ids(messages)


@pytest.mark.parametrize(
    "urlconf",
    [
        "tests.no_such_urls_module",
        "tests.support.testapp.gates",
    ],  # missing; imports, no urlpatterns
)
def test_w009_an_unreadable_urlconf_is_reported_once_and_the_other_checks_run(urlconf):
    """A URLconf that fails to import (or has no ``urlpatterns``): every check of the app
    runs without raising, W009 says once which URLconf and why, and the checks that do
    not need the URLconf still report (here E001)."""
    with override_settings(ROOT_URLCONF=urlconf, IDEMPOTENCY={"LEASE_SECONDS": 5}):
        clear_url_caches()
        try:
            messages = [m for check in _our_checks() for m in check(app_configs=None)]
        finally:
            clear_url_caches()
    assert ids(messages).count("django_idempotency.W009") == 1, messages
    (w009,) = [m for m in messages if m.id == "django_idempotency.W009"]
    assert urlconf in w009.msg and "could not inspect the views" in w009.msg
    assert "django_idempotency.E001" in ids(messages)


def test_w009_names_the_error_a_urlconf_raises_while_importing(tmp_path, monkeypatch):
    """A URLconf whose code raises (not an ImportError) is reported with that error."""
    (tmp_path / "raising_urls.py").write_text("raise RuntimeError('no database at import')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with override_settings(ROOT_URLCONF="raising_urls"):
        clear_url_caches()
        try:
            messages = [m for check in _our_checks() for m in check(app_configs=None)]
        finally:
            clear_url_caches()
            sys.modules.pop("raising_urls", None)
    (w009,) = [m for m in messages if m.id == "django_idempotency.W009"]
    assert "RuntimeError: no database at import" in w009.msg


def test_manage_py_check_passes_with_a_settings_module_without_root_urlconf(tmp_path):
    """``manage.py check`` in a real process, under a worker's settings module that
    leaves ``ROOT_URLCONF`` out: it exits 0 and reports no issue."""
    (tmp_path / "worker_settings.py").write_text(
        "from tests.settings import *  # noqa: F403\n\n"
        "del ROOT_URLCONF  # noqa: F821\n"
        "SILENCED_SYSTEM_CHECKS = ['django_idempotency.W003']  # SQLite outside tests\n"
    )
    root = Path(__file__).resolve().parents[2]
    env = dict(os.environ, DJANGO_SETTINGS_MODULE="worker_settings")
    env["PYTHONPATH"] = os.pathsep.join([str(tmp_path), str(root)])
    done = subprocess.run(
        [sys.executable, "-m", "django", "check"],
        cwd=root,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "System check identified no issues" in done.stdout, done.stdout + done.stderr


# --- E010 (protection that cannot work as stacked, seen in the URLconf) -------------

from django.urls import path  # noqa: E402
from django.views import View  # noqa: E402
from rest_framework import mixins, viewsets  # noqa: E402

from django_idempotency.checks.stacking import check_misplaced_protection  # noqa: E402


@method_decorator(idempotent, name="dispatch")
class _IdempotentDispatch(APIView):
    def post(self, request):
        return Response({})


class _MixinViewSet(IdempotentMixin, mixins.CreateModelMixin, viewsets.GenericViewSet):
    pass


class _InitialWithoutSuper(_MixinViewSet):
    def initial(self, request, *args, **kwargs):
        self.started = True  # DRF's checks and the claim never run


class _InitialWithSuper(_MixinViewSet):
    def initial(self, request, *args, **kwargs):
        super().initial(request, *args, **kwargs)


class _TwiceThroughMethodDecorator(APIView):
    @method_decorator(idempotent(lease=5))
    @idempotent
    def post(self, request):
        return Response({})


class _DjangoSetup(View):
    @idempotent
    def setup(self, request, *args, **kwargs):
        super().setup(request, *args, **kwargs)

    def post(self, request):
        return None


@method_decorator(idempotent, name="dispatch")
class _DjangoDispatch(View):
    def post(self, request):
        return None


def _routed(settings, *views):
    module = type("urls", (), {})()
    module.urlpatterns = [path(f"v{n}", view) for n, view in enumerate(views)]
    settings.ROOT_URLCONF = module
    clear_url_caches()
    try:
        return check_misplaced_protection()
    finally:
        clear_url_caches()


@pytest.mark.parametrize(
    ("view", "says"),
    [
        (_IdempotentDispatch.as_view(), "dispatch() is @idempotent, but dispatch() is part of"),
        (_InitialWithoutSuper.as_view({"post": "create"}), "does not call super().initial()"),
        (_TwiceThroughMethodDecorator.as_view(), "post() is @idempotent twice"),
        (_DjangoSetup.as_view(), "setup() is @idempotent, but setup() is part of"),
    ],
)
def test_e010_protection_that_cannot_work_as_stacked(settings, view, says):
    """A routed view whose protection cannot work as its code is stacked is an Error,
    naming the method and what to write instead: ``@idempotent`` on a DRF view's
    ``dispatch`` (the claim would run before authentication), a subclass's ``initial``
    without ``super()``, two ``@idempotent`` on one handler, a Django view's ``setup``."""
    (error,) = _routed(settings, view)
    assert error.id == "django_idempotency.E010" and error.level == checks.ERROR
    assert says in error.msg, error.msg
    assert error.hint


def test_e010_silent_where_the_protection_works(settings):
    """``@idempotent`` on a Django view's ``dispatch`` protects every handler; a subclass
    that calls ``super().initial()`` keeps the mixin's; the test project's own views
    stack nothing wrongly."""
    assert check_misplaced_protection() == []
    assert _routed(settings, _DjangoDispatch.as_view()) == []
    assert _routed(settings, _InitialWithSuper.as_view({"post": "create"})) == []
    assert _routed(settings, _Reboot.as_view(), _MixinViewSet.as_view({"post": "create"})) == []
