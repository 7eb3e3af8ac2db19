"""A Ninja API whose protected PUT and PATCH operations take file uploads.

Django parses the form bodies of POST only; Ninja needs its
``fix_request_files_middleware`` (which consumes the body) for these operations, and
refuses to declare them without it: import this URLconf with the middleware in
``settings.MIDDLEWARE`` (the ``files_middleware`` fixture of the tests).
"""

from __future__ import annotations

import hashlib
from typing import Any

from django.http import HttpRequest
from django.urls import path
from ninja import File, Form, NinjaAPI, Router, UploadedFile

from django_idempotency.contrib.ninja import idempotent
from tests.support.ninja_api import TokenBearer
from tests.support.testapp.models import Widget

router = Router()


def _store(widget_id: int, name: str, upload: UploadedFile) -> dict[str, Any]:
    """One execution: a ``Widget`` row named after the upload."""
    content = upload.read()
    widget = Widget.objects.create(name=f"{widget_id}:{name}", size=len(content))
    return {"id": widget.pk, "sha256": hashlib.sha256(content).hexdigest()}


@router.put("/widgets/{widget_id}/picture")
@idempotent
def replace_picture(
    request: HttpRequest, widget_id: int, name: Form[str], picture: File[UploadedFile]
) -> dict[str, Any]:
    return _store(widget_id, name, picture)


@router.patch("/widgets/{widget_id}/picture")
@idempotent
def patch_picture(
    request: HttpRequest, widget_id: int, name: Form[str], picture: File[UploadedFile]
) -> dict[str, Any]:
    return _store(widget_id, name, picture)


api = NinjaAPI(urls_namespace="ninja-uploads", auth=TokenBearer())
api.add_router("/", router)

urlpatterns = [path("ninja/", api.urls)]
