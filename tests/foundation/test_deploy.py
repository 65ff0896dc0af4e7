"""Production shape: `manage.py check --deploy` is clean under production settings."""

from __future__ import annotations

import os
import secrets

from django.conf import settings

from tests.foundation.helpers import clean_env, manage


def production_env(**overrides: str | None) -> dict[str, str]:
    production: dict[str, str | None] = {
        "DEBUG": "0",
        "SECRET_KEY": secrets.token_urlsafe(50),
        "DATABASE_URL": os.environ["DATABASE_URL"],
        "REDIS_URL": settings.REDIS_URL,
        "ALLOWED_HOSTS": "oz0.example.com",
        "SECURE_SSL_REDIRECT": None,
        "SESSION_COOKIE_SECURE": None,
        "CSRF_COOKIE_SECURE": None,
        "SECURE_HSTS_SECONDS": None,
    }
    return clean_env(**{**production, **overrides})


def test_it_passes_check_deploy_under_production_settings() -> None:
    result = manage("check", "--deploy", "--fail-level", "WARNING", env=production_env())
    assert result.returncode == 0, result.stdout + result.stderr
    assert "no issues" in result.stdout


def test_it_flags_debug_in_deployment() -> None:
    # The check above is not vacuous: the same command fails when DEBUG is on.
    result = manage("check", "--deploy", "--fail-level", "WARNING", env=production_env(DEBUG="1"))
    assert result.returncode != 0
    assert "security.W018" in result.stdout + result.stderr


def test_it_refuses_production_without_a_secret_key() -> None:
    result = manage("check", env=production_env(SECRET_KEY=None))
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [
        "oz0: SECRET_KEY is not set: production (DEBUG=0) needs a long random SECRET_KEY"
    ]
