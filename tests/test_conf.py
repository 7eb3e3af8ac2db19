from __future__ import annotations

from django.test import override_settings

from django_idempotency.conf import DEFAULTS, conf
from django_idempotency.protocol.options import Options


def test_defaults():
    assert conf.lease == 60.0
    assert conf.retention == 86400.0
    assert conf.required is True
    assert conf.max_key_length == 255
    assert set(conf.release_statuses) == {408, 409, 425, 429}
    assert set(DEFAULTS) >= {"LEASE", "RETENTION", "REQUIRED", "WAIT"}


def test_settings_are_read_at_access_time():
    with override_settings(IDEMPOTENCY={"LEASE": 5, "RETENTION": 7 * 86400}):
        assert conf.lease == 5.0
        assert Options().get_retention() == 7 * 86400
    assert conf.lease == 60.0


def test_view_options_override_settings():
    options = Options.from_kwargs(lease=10, replay_headers=["X-A"])
    with override_settings(IDEMPOTENCY={"LEASE": 5, "REPLAY_HEADERS": ["X-B"]}):
        assert options.get_lease() == 10.0
        assert set(options.get_replay_headers()) == {"X-A", "X-B"}


def test_release_rule():
    options = Options()
    assert options.should_release(500) and options.should_release(503)
    assert options.should_release(429) and options.should_release(409)
    assert not options.should_release(201) and not options.should_release(402)
    custom = Options.from_kwargs(release=lambda status: status == 402)
    assert custom.should_release(402) and not custom.should_release(500)


def test_principal_resolver_dotted_path():
    with override_settings(
        IDEMPOTENCY={"PRINCIPAL_RESOLVER": "django_idempotency.principals.auth_token_principal"}
    ):
        from django_idempotency.principals import auth_token_principal

        assert conf.principal_resolver is auth_token_principal
