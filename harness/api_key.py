"""The one lookup of an API key: read from a named environment variable at call time, so
no key is ever stored in a config, a spec or a model."""

from __future__ import annotations

import os

from harness.errors import ConfigError


def read_key(env_name: str | None, purpose: str) -> str | None:
    """The key in `env_name` (None when no variable is named); a named variable that is
    unset or empty is a ConfigError naming it and what the key is for."""
    if not env_name:
        return None
    key = os.environ.get(env_name)
    if not key:
        raise ConfigError(f"environment variable {env_name} is not set ({purpose})")
    return key


def bearer_headers(key: str | None) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"} if key else {}
