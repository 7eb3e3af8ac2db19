"""DRF's browsable API on idempotent views, driven as a browser drives it.

A logged-in browser (session authentication, CSRF enforced) GETs the page, reads the
form it renders, and submits it: the HTML form as a plain browser POST
(``multipart/form-data``), the raw data form as DRF's ``ajax-form.js`` sends it (the
``_content`` text as the body, ``X-CSRFToken``, and the ``Idempotency-Key`` header that
``browsable_api.js`` adds). Each rendered form runs the view once.
"""

from __future__ import annotations

import json
import re
from html.parser import HTMLParser
from importlib import resources
from typing import Any

import pytest
from django.test import Client
from rest_framework.test import APIClient

from django_idempotency.contrib.browsable import KEY_FIELD, REPLAY_MARKER
from django_idempotency.models import IdempotencyRecord
from tests.support.factories import UserFactory
from tests.support.testapp.models import Widget

pytestmark = [pytest.mark.django_db, pytest.mark.urls("tests.support.browsable_app")]


@pytest.fixture(autouse=True)
def _csrf_middleware(settings: Any) -> None:
    """A project's middleware: the CSRF cookie is set on the page, checked on the POST."""
    settings.MIDDLEWARE = [*settings.MIDDLEWARE, "django.middleware.csrf.CsrfViewMiddleware"]


BROWSER_ACCEPT = "text/html,application/xhtml+xml,application/xml;q=0.9,*/*;q=0.8"
AJAX_ACCEPT = "text/html; q=1.0, */*"  # what ajax-form.js asks for


class Page(HTMLParser):
    """The POST forms of a page (their fields as a browser would send them) and the
    key that ``browsable_api.js`` reads."""

    def __init__(self, html: str) -> None:
        super().__init__()
        self.forms: list[dict[str, Any]] = []
        self.scripts: list[str] = []
        self.key_json = ""
        self._form: dict[str, Any] | None = None
        self._field: str | None = None  # a textarea or select being read
        self._in_key = False
        self.feed(html)

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = {name: value or "" for name, value in attrs}
        if tag == "form" and a.get("method", "").upper() == "POST":
            self._form = {"action": a["action"], "enctype": a.get("enctype", ""), "fields": {}}
            self.forms.append(self._form)
        elif tag == "script":
            self.scripts.append(a.get("src", ""))
            self._in_key = a.get("id") == "idempotency_key"
        elif self._form is not None and "name" in a:
            if tag == "input":
                self._form["fields"][a["name"]] = a.get("value", "")
            elif tag in ("textarea", "select"):
                self._field = a["name"]
                self._form["fields"][self._field] = ""
        elif tag == "option" and self._form is not None and self._field and "selected" in a:
            self._form["fields"][self._field] = a.get("value", "")

    def handle_endtag(self, tag: str) -> None:
        if tag == "form":
            self._form = None
        elif tag in ("textarea", "select"):
            self._field = None
        elif tag == "script":
            self._in_key = False

    def handle_data(self, data: str) -> None:
        if self._in_key:
            self.key_json += data

    def html_form(self) -> dict[str, Any]:
        (form,) = [f for f in self.forms if f["enctype"] == "multipart/form-data"]
        return form

    def raw_form(self) -> dict[str, Any]:
        (form,) = [f for f in self.forms if "_content" in f["fields"]]
        return form


#: The start of the notice a replayed page shows.
NOTICE = '<div class="alert alert-info" role="status" id="idempotency-replayed">'


def as_first_sent(replay: Any) -> bytes:
    """The replayed page without its notice: the page as the first request got it."""
    return re.sub(
        rb'<div class="alert alert-info" role="status" id="idempotency-replayed">.*?</div>',
        REPLAY_MARKER,
        replay.content,
        count=1,
        flags=re.S,
    )


def browser() -> Client:
    client = Client(enforce_csrf_checks=True)
    client.force_login(UserFactory())
    return client


def open_page(client: Client, url: str) -> Page:
    page = client.get(url, HTTP_ACCEPT=BROWSER_ACCEPT)
    assert page["Content-Type"].startswith("text/html"), page.content[:200]
    return Page(page.content.decode())


def submit_html_form(client: Client, form: dict[str, Any], **typed: str) -> Any:
    """What a browser sends for the form: its fields, ``typed`` into the visible ones."""
    fields = {**form["fields"], **typed}
    return client.post(form["action"], fields, HTTP_ACCEPT=BROWSER_ACCEPT)


@pytest.mark.parametrize("url", ["/browse/widgets", "/browse/viewset"])
def test_the_html_form_submitted_twice_runs_once_and_is_replayed(url: str):
    client = browser()
    form = open_page(client, url).html_form()
    assert form["fields"][KEY_FIELD]  # the key of this render, in a hidden field
    assert "csrfmiddlewaretoken" in form["fields"]

    first = submit_html_form(client, form, name="gadget", size="2")
    assert first.status_code == 201, first.content[:300]
    assert first["Content-Type"].startswith("text/html")  # the browsable page
    assert "Idempotent-Replayed" not in first
    again = submit_html_form(client, form, name="gadget", size="2")  # a resubmission
    assert again.status_code == 201 and again["Idempotent-Replayed"] == "true"
    assert NOTICE not in first.content.decode() and NOTICE in again.content.decode()
    assert as_first_sent(again) == first.content  # the stored page, marked
    assert list(Widget.objects.values_list("name", flat=True)) == ["gadget"]
    assert IdempotencyRecord.objects.get().key == form["fields"][KEY_FIELD]


def test_a_replayed_page_says_it_is_a_replay_and_an_api_client_gets_the_stored_bytes():
    """The person reading the page sees that the view did not run again; the page's
    ``Content-Length`` counts the notice. A JSON client that retries the key of a
    JSON first request gets the stored bytes, unmarked."""
    client = browser()
    form = open_page(client, "/browse/widgets").html_form()
    submit_html_form(client, form, name="gadget", size="2")
    again = submit_html_form(client, form, name="gadget", size="2")
    html = again.content.decode()
    assert "Replayed." in html and "the view did not run again" in html
    assert html.index(NOTICE) < html.index("gadget")  # at the top of the content
    assert int(again["Content-Length"]) == len(again.content)

    api = APIClient()
    api.force_authenticate(UserFactory())
    key = "5a1e3a52-3c9e-4e0f-8a55-0b3c5b9c2d11"
    first = api.post("/browse/widgets", {"name": "api", "size": 1}, format="json",
                     HTTP_IDEMPOTENCY_KEY=key)  # fmt: skip
    retry = api.post("/browse/widgets", {"name": "api", "size": 1}, format="json",
                     HTTP_IDEMPOTENCY_KEY=key)  # fmt: skip
    assert retry["Idempotent-Replayed"] == "true" and retry.content == first.content


def test_each_render_is_a_new_operation():
    client = browser()
    first_form = open_page(client, "/browse/widgets").html_form()
    second_form = open_page(client, "/browse/widgets").html_form()
    assert first_form["fields"][KEY_FIELD] != second_form["fields"][KEY_FIELD]
    assert submit_html_form(client, first_form, name="a", size="1").status_code == 201
    assert submit_html_form(client, second_form, name="a", size="1").status_code == 201
    assert Widget.objects.count() == 2


def test_the_same_rendered_form_with_other_values_is_a_key_reused():
    client = browser()
    form = open_page(client, "/browse/widgets").html_form()
    assert submit_html_form(client, form, name="a", size="1").status_code == 201
    changed = submit_html_form(client, form, name="b", size="1")
    assert changed.status_code == 422 and json.loads(changed.content)["differs"] == ["body"]
    assert Widget.objects.count() == 1


def test_the_raw_data_form_as_ajax_form_js_sends_it_runs_once():
    client = browser()
    page = open_page(client, "/browse/widgets")
    assert any(src.endswith("django_idempotency/browsable_api.js") for src in page.scripts)
    key = json.loads(page.key_json)
    assert re.fullmatch(r"[0-9a-f-]{36}", key)
    form = page.raw_form()
    assert form["fields"]["_content_type"] == "application/json"

    def send() -> Any:
        return client.post(
            form["action"],
            '{"name": "raw", "size": 4}',  # typed into the _content textarea
            content_type=form["fields"]["_content_type"],
            HTTP_ACCEPT=AJAX_ACCEPT,
            HTTP_X_CSRFTOKEN=client.cookies["csrftoken"].value,
            HTTP_IDEMPOTENCY_KEY=key,  # set by browsable_api.js on every unsafe request
        )

    first, again = send(), send()
    assert first.status_code == 201 and again["Idempotent-Replayed"] == "true"
    assert NOTICE in again.content.decode() and as_first_sent(again) == first.content
    assert Widget.objects.get().name == "raw"


def test_the_script_that_sends_the_header_ships_with_the_package():
    script = resources.files("django_idempotency") / "static/django_idempotency/browsable_api.js"
    text = script.read_text()
    assert 'getElementById("idempotency_key")' in text and "Idempotency-Key" in text


def test_without_the_key_field_a_browser_form_is_still_refused():
    client = browser()
    form = open_page(client, "/browse/widgets").html_form()
    del form["fields"][KEY_FIELD]
    refused = submit_html_form(client, form, name="a", size="1")
    assert refused.status_code == 400
    assert json.loads(refused.content)["type"].endswith("missing-key")
    assert Widget.objects.count() == 0


def test_drfs_own_renderer_leaves_the_form_without_a_key_and_the_post_is_refused():
    client = browser()
    form = open_page(client, "/browse/plain").html_form()
    assert KEY_FIELD not in form["fields"]
    refused = submit_html_form(client, form, name="a", size="1")
    assert refused.status_code == 400
    assert json.loads(refused.content)["type"].endswith("missing-key")
    assert Widget.objects.count() == 0


@pytest.mark.parametrize("fmt", ["multipart", "json"])
def test_an_api_client_is_never_read_for_the_field(fmt: str):
    api = APIClient()
    api.force_authenticate(UserFactory())
    data = {"name": "a", "size": 1, KEY_FIELD: "0d6f4c2e-8a43-4c56-9d1b-6d0f9ad6a001"}
    refused = api.post("/browse/widgets", data, format=fmt)  # asks for JSON
    assert refused.status_code == 400
    assert json.loads(refused.content)["type"].endswith("missing-key")
    assert Widget.objects.count() == 0 and IdempotencyRecord.objects.count() == 0
