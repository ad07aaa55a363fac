"""Kubernetes' own rules for names, label selectors and durations, for the models of every layer that carries them."""

from __future__ import annotations

import re
from datetime import timedelta

from activities.support.selectors import SelectorError, parse_label_selector

_DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")


def validate_label_selector(value: str | None) -> str | None:
    """Pydantic validator helper: reject a selector the API server would reject."""
    if value is None:
        return None
    try:
        parse_label_selector(value)
    except SelectorError as err:
        raise ValueError(str(err)) from err
    return value


def validate_object_name(value: str) -> str:
    if len(value) > 253 or not _DNS_SUBDOMAIN.match(value):
        raise ValueError(f"{value!r} is not a valid Kubernetes object name (RFC 1123 subdomain)")
    return value


def validate_positive_duration(value: timedelta) -> timedelta:
    if value <= timedelta(0):
        raise ValueError("must be a positive duration")
    return value
