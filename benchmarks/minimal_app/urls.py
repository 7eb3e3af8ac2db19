from __future__ import annotations

from django.urls import path

from .views import ItemCreate

urlpatterns = [path("items", ItemCreate.as_view())]
