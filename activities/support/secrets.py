"""Secret references: where a credential lives, never the credential itself.

A `SecretRef` is what configuration, workflow inputs and histories carry; the value is
read only inside the activity that needs it, at the moment it needs it, so it never
enters a workflow's input, output or history, and a rotated secret is picked up by the
next attempt without restarting the worker.

String forms:

- ``env:NAME``   the value of the worker's environment variable NAME;
- ``file:PATH``  the contents of a file (surrounding whitespace stripped), e.g. a
  mounted Kubernetes Secret or a lab token file with mode 0600.

Reusable for NetBox API tokens today, BMC and UFM credentials later.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Literal

from pydantic import ConfigDict, Field, model_validator

from activities.models import StrictModel

_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


class SecretError(Exception):
    """A secret that cannot be resolved; the message names the reference, never a value."""


class SecretRef(StrictModel):
    """Where to read one secret from: an environment variable or a file."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    source: Literal["env", "file"]
    name: str = Field(min_length=1, description="Environment variable name, or file path.")

    @model_validator(mode="after")
    def _check(self) -> SecretRef:
        if self.source == "env" and not _ENV_NAME.match(self.name):
            raise ValueError(f"{self.name!r} is not an environment variable name")
        return self

    @classmethod
    def parse(cls, text: str) -> SecretRef:
        """``env:NAME`` or ``file:/path``; anything else is refused (a bare value is not a reference)."""
        source, sep, name = text.strip().partition(":")
        if not sep or source not in ("env", "file") or not name:
            # Never echo the text: a pasted token must not land in a log or an error.
            raise ValueError("a secret reference is 'env:NAME' or 'file:/path/to/file'")
        return cls(source=source, name=name)

    def __str__(self) -> str:
        return f"{self.source}:{self.name}"

    def resolve(self) -> str:
        """Read the secret now. Raises SecretError naming the reference (not the value)."""
        if self.source == "env":
            value = os.environ.get(self.name)
            if value is None or not value.strip():
                raise SecretError(f"secret {self}: environment variable {self.name} is not set or empty")
            return value.strip()
        path = Path(self.name).expanduser()
        try:
            value = path.read_text()
        except OSError as err:
            raise SecretError(f"secret {self}: cannot read {path}: {err.strerror or type(err).__name__}") from None
        if not value.strip():
            raise SecretError(f"secret {self}: {path} is empty")
        return value.strip()
