"""The base of every Millwright model: unknown fields are refused at every depth.

A typo in JSON typed into the Temporal UI, a CLI file or another service's request (``"delete_empty_dir_data"``
inside ``drain``) must fail at the edge naming the field's full path, not be silently dropped and turn into a
default. Every model that crosses a process boundary (workflow, update and signal arguments, activity requests
and results, state carried across continue-as-new) derives from ``StrictModel``, so a new one cannot forget it.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict


class StrictModel(BaseModel):
    model_config = ConfigDict(extra="forbid")
