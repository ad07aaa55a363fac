"""A PKey read, and a write to UFM that is done only when the PKey reads back changed.

Reads: a missing PKey is a 404 or, on some releases, 200 ``{}``: both read as absent.

UFM's answer to a write does not decide that it is done: every write is read back (`PKeyClient._write`), and
its body is not parsed (some releases answer plain text). A write whose answer is lost (the connection dropped
after UFM applied it, a timeout, a 5xx from its front) and that reads back applied counts as done by this attempt,
so the result says what this run changed; one answered with success that does not read back is retried
(``UfmWriteNotApplied``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from temporalio.exceptions import ApplicationError

from activities.support.tls import TrustingClient
from activities.ufm.client import UfmClient
from activities.ufm.models import PKeyMembers, normalize_guid


class PKeyClient(UfmClient):
    """The UFM client with PKey reads and read-back writes."""

    async def _write(self, client: TrustingClient, method: str, path: str, doing: str, pkey: str,
                     landed: Callable[[PKeyMembers], bool], **kw: Any) -> PKeyMembers:  # fmt: skip
        """One write, then PKey `pkey` read back: the write is done when `landed` says the read shows it.

        A retryable failure (the answer lost after UFM applied the write, a timeout, a 5xx) is read back too: a
        write that landed counts as this attempt's, and only one that did not is raised for the retry policy.
        A success answer whose change does not read back is retryable ``UfmWriteNotApplied``: the next attempt
        reads first and writes only what is still missing. A rejection (4xx) is raised as it is. Returns the
        read."""
        failed: ApplicationError | None = None
        try:
            await self._call(client, method, path, doing, parse=False, **kw)
        except ApplicationError as err:
            if err.non_retryable:
                raise
            failed = err
        try:
            have = await self._members(client, pkey)
        except ApplicationError:
            if failed is not None:
                raise failed from None  # the write's own error says more than the read's
            raise
        if landed(have):
            return have
        if failed is not None:
            raise failed
        raise ApplicationError(
            f"{doing}: UFM answered success, but PKey {pkey} does not read back changed "
            f"(exists: {have.exists}, {len(have.members)} members)",
            type="UfmWriteNotApplied",
        )

    async def _members(self, client: TrustingClient, pkey: str) -> PKeyMembers:
        body = await self._call(
            client, "GET", f"/resources/pkeys/{pkey}", f"reading PKey {pkey}", ok404=True, params={"guids_data": "true"}
        )
        if not body:  # 404, or the 200 {} some releases answer for a PKey that does not exist
            return PKeyMembers(pkey=pkey, exists=False)
        return pkey_members(pkey, body)


def pkey_members(pkey: str, body: dict) -> PKeyMembers:
    return PKeyMembers(
        pkey=pkey, exists=True, partition=str(body.get("partition") or ""),
        members={normalize_guid(g["guid"]): g.get("membership", "full") for g in body.get("guids") or []},
    )  # fmt: skip
