"""The NetBox client: its settings, a pynetbox session with Millwright's User-Agent, timeout and TLS, and records read
as plain values."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from datetime import datetime
from typing import Any, TypeVar

from pydantic import Field, field_validator
from temporalio import activity
from temporalio.exceptions import ApplicationError

from activities.models import BaseUrl, StrictModel
from activities.netbox.errors import NETBOX_TLS_FIX, answer_lost, netbox_error
from activities.netbox.models import DeviceInfo, DeviceLookup, ObjectResult
from activities.support.secrets import SecretError, SecretRef
from activities.support.tls import Trust, ca_bundle_ref

USER_AGENT = "millwright-worker"
_REQUEST_TIMEOUT = 15.0


class NetBoxConfig(StrictModel):
    """Where NetBox is and where its token is kept; the token itself is never held here."""

    url: BaseUrl
    token: SecretRef
    timeout_seconds: float = _REQUEST_TIMEOUT
    ca_bundle: str | None = Field(None, description="CA bundle reference (file:/path/to/ca.pem) for NetBox's "
                                                    "certificate; default: the default CAs")  # fmt: skip
    verify_tls: bool = True

    _ca_bundle_ok = field_validator("ca_bundle")(ca_bundle_ref)


def netbox_session(timeout: float, verify: bool | str):
    import requests

    class TimeoutSession(requests.Session):
        """A request that hangs is an error after `timeout`; no retries (the adapter default). `verify` goes with
        each request: as the session's default, REQUESTS_CA_BUNDLE in the environment would replace it."""

        def request(self, *args, **kwargs):
            kwargs.setdefault("timeout", timeout)
            kwargs.setdefault("verify", verify)
            return super().request(*args, **kwargs)

    session = TimeoutSession()
    session.headers["User-Agent"] = USER_AGENT
    return session


T = TypeVar("T")


def record_fields(record: Any) -> dict[str, Any]:
    return dict(record) if record is not None else {}


def field_value(field: Any) -> Any:
    """A choice field ({'value', 'label'}) or a nested object ({'slug'/'name'}) as one value."""
    if isinstance(field, dict):
        for key in ("value", "slug", "name"):
            if key in field:
                return field[key]
    return field


def device_info(record: Any) -> DeviceInfo:
    d = record_fields(record)
    return DeviceInfo(
        id=d["id"],
        name=d.get("name"),
        serial=d.get("serial") or "",
        asset_tag=d.get("asset_tag"),
        status=field_value(d.get("status")),
        role=field_value(d.get("role")) if d.get("role") else None,
        site=field_value(d.get("site")) if d.get("site") else None,
        tenant=field_value(d.get("tenant")) if d.get("tenant") else None,
        cluster=(d.get("cluster") or {}).get("name") if d.get("cluster") else None,
        tags=[t.get("slug") for t in d.get("tags") or [] if isinstance(t, dict)],
        custom_fields=d.get("custom_fields") or {},
    )


class NetBoxClient:
    """What every NetBox activity calls through: a session per call, reads and writes in a thread, a write whose
    answer was lost read back, journal entries written once. With no config every call fails with
    NetBoxNotConfigured."""

    def __init__(self, config: NetBoxConfig | None) -> None:
        self._config = config

    async def close(self) -> None:  # a Registration resource; sessions are per call
        return None

    def _api(self) -> tuple[Any, Trust]:
        import pynetbox

        if self._config is None:
            raise ApplicationError(
                "NetBox is not configured on this worker: set MILLWRIGHT_NETBOX_URL and MILLWRIGHT_NETBOX_TOKEN "
                "(a secret reference: env:NAME or file:/path)",
                type="NetBoxNotConfigured",
                non_retryable=True,
            )
        try:
            token = self._config.token.resolve()
        except SecretError as err:
            raise ApplicationError(f"NetBox token: {err}", type="NetBoxNotConfigured", non_retryable=True) from None
        trust = Trust.resolve(NETBOX_TLS_FIX, verify=self._config.verify_tls, ca_bundle=self._config.ca_bundle,
                              setting="MILLWRIGHT_NETBOX_CA_BUNDLE")  # fmt: skip
        api = pynetbox.api(self._config.url, token=token)
        api.http_session = netbox_session(self._config.timeout_seconds, trust.for_requests())
        return api, trust

    async def _in_thread(self, doing: str, fn: Callable[[Any], T]) -> T:
        """Run `fn(api)` in a thread, mapping NetBox and transport errors for the retry policy."""
        api, trust = self._api()
        assert self._config is not None  # _api() refuses a worker without one
        doing = f"{doing} at NetBox {self._config.url}"  # the endpoint, for a run that shows why it waits

        def call() -> T:
            try:
                return fn(api)
            finally:
                api.http_session.close()

        try:
            return await asyncio.to_thread(call)
        except ApplicationError:
            raise
        except Exception as err:
            raise netbox_error(err, doing, trust) from None

    def _upsert(self, endpoint: Any, key: dict[str, str], want: dict[str, Any]) -> ObjectResult:
        """Create the object named by `key`, or bring its fields to `want`; say which happened."""
        (name,) = key.values()
        found = endpoint.get(**key)
        if found is None:
            created = self._create(name, endpoint, {**key, **want}, key)
            return ObjectResult(id=created.id, name=name, created=True)
        diff = fields_diff(record_fields(found), want)
        if diff:
            self._update(name, endpoint, found, diff)
        return ObjectResult(id=found.id, name=name, created=False, updated=sorted(diff))

    def _after_write(self, what: str) -> None:
        """Called after each write. A no-op; tests override it to crash an attempt mid-activity."""

    def _write(self, what: str, write: Callable[[], T], landed: Callable[[], T | None]) -> T:
        """Do `write`; when its answer is lost (`answer_lost`), read back: `landed()` returns what the write
        would have returned when NetBox carried it out (then the attempt goes on as if the answer had come),
        else None (then the write's error goes to the retry policy, and the next attempt writes again)."""
        try:
            done = write()
        except Exception as err:
            if not answer_lost(err):
                raise
            try:
                found = landed()
            except Exception:  # NetBox still unreachable: the write's own error says more
                found = None
            if not found:
                raise
            done = found
        self._after_write(what)
        return done

    def _create(self, what: str, endpoint: Any, fields: dict[str, Any], find: dict[str, Any]) -> Any:
        """Create an object with `fields`; a lost answer is read back with the filters `find` (its stable key)."""
        return self._write(what, lambda: endpoint.create(fields), lambda: endpoint.get(**find))

    def _update(self, what: str, endpoint: Any, record: Any, changes: dict[str, Any],
                landed: Callable[[Any], bool] | None = None) -> None:  # fmt: skip
        """PATCH `changes` onto `record`; a lost answer is read back: done when `landed(fresh record)` (default:
        the record shows every change)."""

        def applied() -> bool:
            fresh = endpoint.get(record.id)
            return fresh is not None and (landed(fresh) if landed else not fields_diff(record_fields(fresh), changes))

        self._write(what, lambda: record.update(changes) or True, applied)

    @staticmethod
    def _run_marker() -> str:
        """Names the workflow run and activity: the same on every retry of this activity."""
        info = activity.info()
        return f"millwright:{info.workflow_id}:{info.workflow_run_id}:{info.activity_id}"

    def _resolve_device(self, api: Any, lookup: DeviceLookup) -> Any:
        record = self._find_device(api, lookup)
        if record is None:
            raise ApplicationError(f"no {lookup} in NetBox", type="DeviceNotFound", non_retryable=True)
        return record

    @staticmethod
    def _find_device(api: Any, lookup: DeviceLookup) -> Any | None:
        filters: dict[str, Any] = {}
        if lookup.name:
            filters["name"] = lookup.name
        elif lookup.serial:
            filters["serial"] = lookup.serial
        else:
            filters["asset_tag"] = lookup.asset_tag
        if lookup.site:
            filters["site"] = lookup.site
        found = list(api.dcim.devices.filter(**filters))
        if len(found) > 1:
            # Serials are not unique in NetBox, names only per (site, tenant): never guess.
            raise ApplicationError(
                f"{len(found)} devices match {lookup}: " + ", ".join(f"#{d.id} {d.name}" for d in found[:10]),
                type="AmbiguousDevice",
                non_retryable=True,
            )
        return found[0] if found else None

    def _ensure_journal(self, api: Any, record: Any, kind: str, text: str,
                        object_type: str = "dcim.device") -> tuple[int, bool]:  # fmt: skip
        """One journal entry per activity on `record` (marker in its last line); a retry finds it instead of
        adding one."""
        marker = self._run_marker()

        def existing() -> Any:
            return next((e for e in api.extras.journal_entries.filter(
                assigned_object_type=object_type, assigned_object_id=record.id, q=marker)
                if marker in (e.comments or "")), None)  # fmt: skip

        found = existing()
        if found is not None:
            return found.id, False
        info = activity.info()
        comments = (
            f"{text}\n\n"
            f"— Millwright workflow `{info.workflow_id}` run `{info.workflow_run_id}` "
            f"({info.activity_type})\n\n`{marker}`"
        )
        entry = self._write("journal", lambda: api.extras.journal_entries.create(
            assigned_object_type=object_type, assigned_object_id=record.id, kind=kind, comments=comments,
        ), existing)  # fmt: skip
        return entry.id, True


def same_custom_field(have: Any, want: Any) -> bool:
    if isinstance(have, dict) and "value" in have:  # a select field reads back as {"value", "label"}
        have = have["value"]
    if isinstance(have, str) and isinstance(want, str):
        # NetBox normalizes datetimes (e.g. 'Z' vs '+00:00'); compare the instants.
        try:
            return datetime.fromisoformat(have.replace("Z", "+00:00")) == datetime.fromisoformat(
                want.replace("Z", "+00:00")
            )
        except ValueError:
            return have == want
    return have == want


def fields_diff(current: dict[str, Any], want: dict[str, Any]) -> dict[str, Any]:
    """The fields of `want` that differ from the record (nested objects compared by id or value)."""
    out: dict[str, Any] = {}
    for key, value in want.items():
        have = current.get(key)
        if key == "custom_fields":
            have_cf = have or {}
            changed = {k: v for k, v in value.items() if not same_custom_field(have_cf.get(k), v)}
            if changed:
                out[key] = changed
            continue
        if isinstance(have, dict):
            have = have.get("id", have.get("value"))
        if (have or None) != (value or None):
            out[key] = value
    return out
