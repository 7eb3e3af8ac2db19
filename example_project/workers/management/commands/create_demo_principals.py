"""``manage.py create_demo_principals``: users alice and bob with fixed API tokens."""

from __future__ import annotations

from typing import Any

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand
from django.db import transaction
from rest_framework.authtoken.models import Token

from workers.demo_principals import DEMO_TOKENS


class Command(BaseCommand):
    help = (
        "Create the demo users alice and bob with their fixed, published API tokens. "
        "Safe to run again: existing users keep their data and get the same tokens."
    )

    def handle(self, *args: Any, **options: Any) -> None:
        user_model = get_user_model()
        for username, key in DEMO_TOKENS.items():
            with transaction.atomic():
                user, created = user_model.objects.get_or_create(username=username)
                if created:
                    user.set_unusable_password()  # API tokens only, no admin login
                    user.save()
                Token.objects.filter(user=user).exclude(key=key).delete()
                Token.objects.filter(key=key).exclude(user=user).delete()
                Token.objects.get_or_create(user=user, key=key)
            verb = "created" if created else "exists "
            self.stdout.write(f"{verb} {username:<6} Authorization: Token {key}")
