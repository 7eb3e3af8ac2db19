from __future__ import annotations

from django.urls import path

from .views import ItemCreate, ItemCreateFloor, ItemCreatePadded, ItemCreateSql

urlpatterns = [
    path("items", ItemCreate.as_view()),
    path("items-floor", ItemCreateFloor.as_view()),
    path("items-sql", ItemCreateSql.as_view()),
    path("items-padded", ItemCreatePadded.as_view()),
]
