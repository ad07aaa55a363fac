"""The Redfish shapes the lab's BMC and its update service share: the error answer and a collection document.

Apart from lab/bmc.py so that lab/bmc_update.py uses them without importing the BMC that imports it.
"""

from __future__ import annotations

from aiohttp import web

BASE = "Base.1.15"  # the Base message registry the errors name


class RedfishError(Exception):
    """An answer in the Redfish error shape."""

    def __init__(
        self, status: int, message_id: str, message: str, resolution: str = "None.", headers: dict | None = None
    ) -> None:
        super().__init__(message)
        self.status, self.message_id, self.message = status, message_id, message
        self.resolution, self.headers = resolution, headers

    def response(self) -> web.Response:
        info = {
            "@odata.type": "#Message.v1_1_1.Message",
            "MessageId": f"{BASE}.{self.message_id}",
            "Message": self.message,
            "MessageArgs": [],
            "MessageSeverity": "Critical",
            "Severity": "Critical",
            "Resolution": self.resolution,
        }
        body = {"error": {"code": f"{BASE}.GeneralError", "message": self.message, "@Message.ExtendedInfo": [info]}}
        return web.json_response(body, status=self.status, headers=self.headers)


def collection(oid: str, kind: str, name: str, members: list[str]) -> dict:
    return {
        "@odata.id": oid,
        "@odata.type": f"#{kind}.{kind}",
        "Name": name,
        "Members@odata.count": len(members),
        "Members": [{"@odata.id": m} for m in members],
    }
