"""The default problem ``type`` URIs: tag URIs (RFC 4151) that name no web site."""

from __future__ import annotations

import json
import re
from pathlib import Path
from urllib.parse import urlsplit

import pytest

from django_idempotency.conf import conf
from django_idempotency.protocol import problems

pytestmark = pytest.mark.django_db

PROBLEMS_PAGE = Path(__file__).resolve().parents[2] / "docs" / "problems.md"

#: RFC 4151: "tag:" authorityName "," date ":" specific [ "#" fragment ].
TAG_URI = re.compile(
    r"^tag:(?P<authority>[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?(?:\.[A-Za-z0-9-]+)*),"
    r"(?P<date>\d{4}(?:-\d{2}(?:-\d{2})?)?):(?P<specific>[^#]*)(?:#(?P<fragment>.*))?$"
)
SLUGS = sorted(
    {value.slug for value in vars(problems).values() if isinstance(value, problems.ProblemType)}
)


def test_the_default_base_is_a_tag_uri_not_a_web_address() -> None:
    assert conf.problem_type_base == "tag:django-idempotency,2026:problems#"
    assert urlsplit(conf.problem_type_base).scheme == "tag"


@pytest.mark.parametrize("slug", SLUGS)
def test_every_type_is_a_valid_tag_uri_ending_in_its_documented_slug(slug: str) -> None:
    match = TAG_URI.match(conf.problem_type_base + slug)

    assert match is not None
    assert match["authority"] == "django-idempotency"
    assert match["fragment"] == slug
    assert f'<a id="{slug}"></a>' in PROBLEMS_PAGE.read_text()  # its section there


def test_a_missing_key_answers_with_the_tag_uri(api) -> None:
    response = api.post("/widgets", {"name": "a"}, format="json")

    assert response.status_code == 400
    body = json.loads(response.content)
    assert body["type"] == "tag:django-idempotency,2026:problems#missing-key"
