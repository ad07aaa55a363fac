"""How the Redfish activities authenticate to a BMC: HTTP Basic, which creates no session (none to leak when a worker
dies), or, on a BMC with Basic turned off, one X-Auth-Token session per attempt (activities/redfish.py uses it on its
connection, activities/firmware/activities.py on sushy's)."""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import TypeVar

from sushy import exceptions as sushy_errors
from sushy.connector import Connector

T = TypeVar("T")
SESSIONS = "/redfish/v1/SessionService/Sessions"  # a URI DSP0266 fixes
_SESSION_BMCS: set[str] = set()  # BMCs (by URL) that refused Basic and took a session: this worker logs in there


class BmcAuth:
    """HTTP Basic on a connector, or, on a BMC that refuses it (401) and takes a session, one X-Auth-Token
    session that `close` logs out. A wrong password is still refused: by the login, or, where the BMC has no
    session service, by Basic's own 401."""

    def __init__(self, url: str, conn: Connector, user: str, password: str) -> None:
        self.url, self.conn, self._user, self._password = url, conn, user, password
        self._session: str | None = None
        conn.set_http_basic_auth(user, password)

    def run(self, fn: Callable[[], T]) -> T:
        """`fn`, again in a session if Basic was refused: every request of a BMC without Basic is refused, so the
        first try changed nothing."""
        if self._session is None and self.url in _SESSION_BMCS:
            self._log_in()
        try:
            return fn()
        except sushy_errors.AccessError as refused:
            if self._session is not None or refused.status_code != 401:
                raise
            try:
                self._log_in()
            except sushy_errors.AccessError:
                raise
            except sushy_errors.HTTPError:  # no session service to log in to: the credentials were refused
                raise refused from None
            _SESSION_BMCS.add(self.url)
        return fn()

    def _log_in(self) -> None:
        self.conn._session.auth = None  # sushy keeps the Basic credentials there: a session replaces them
        rsp = self.conn.post(SESSIONS, data={"UserName": self._user, "Password": self._password})
        token = rsp.headers.get("X-Auth-Token")
        if not token:
            raise sushy_errors.MissingXAuthToken(method="POST", url=SESSIONS, response=rsp)
        self.conn.set_http_session_auth(token)
        self._session = rsp.headers.get("Location") or rsp.json()["@odata.id"]

    def close(self) -> None:
        if self._session is not None:
            with contextlib.suppress(sushy_errors.SushyError):  # one not logged out expires on the BMC
                self.conn.delete(self._session)
            self._session = None
