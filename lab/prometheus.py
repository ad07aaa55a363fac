"""A Prometheus HTTP API stub for the lab: ``python -m lab.prometheus --port 0 --ready-file F``.

``GET``/``POST /api/v1/query?query=...`` answers in the real response shape
(``{"status": "success", "data": {"resultType": "vector", "result": [...]}}``) from what a test set:

* ``POST /_lab/series {"query": "...", "value": 1.0}`` — one sample, no labels;
* ``POST /_lab/series {"query": "...", "result": [{"metric": {...}, "value": 1.0}, ...]}`` — any vector
  (``value`` may also be the real ``[ts, "1"]`` pair);
* ``POST /_lab/series {"query": "...", "error": "...", "errorType": "bad_data", "status": 400}`` — an error;
* ``DELETE /_lab/series`` forgets everything; ``GET /_lab/series`` lists what is set;
  ``GET /_lab/requests`` lists the queries asked (newest last);
* ``POST /_lab/samples {"samples": [{"metric": {"__name__": "DCGM_FI_DEV_XID_ERRORS", "Hostname": "n1",
  "gpu": "0"}, "value": 79}, ...]}`` — raw series (what dcgm-exporter would export, as scraped), replacing any
  with the same labels (``"value": null`` drops one); ``DELETE /_lab/samples`` forgets them.

A query set with ``/_lab/series`` answers by exact string. Any other query that is one vector selector
(``name{l="v", l!="v", l=~"re", l!~"re"}``, or ``{__name__=~"a|b", ...}``), optionally compared with a number
(``> 0``, ``!= 0``, ...), is evaluated over the raw series as Prometheus would: regexes fully anchored, a missing
label matching as the empty string, the metric name kept. Anything else answers an empty vector; an empty query
is ``bad_data`` 400, as the real server answers.
"""

from __future__ import annotations

import asyncio
import json
import logging
import operator
import re
import sys
import time
from collections import deque
from typing import Any

from aiohttp import web

from lab.k8s.process import ChildProcess
from lab.loopback import serve_app, server_arguments

log = logging.getLogger("lab.prometheus")


def _error(status: int, error_type: str, message: str) -> web.Response:
    return web.json_response({"status": "error", "errorType": error_type, "error": message}, status=status)


def _sample(value: Any, ts: float) -> list:
    if isinstance(value, (list, tuple)) and len(value) == 2:
        return [float(value[0]), str(value[1])]
    return [ts, _fmt(value)]


_SELECTOR = re.compile(
    r"^\s*(?P<name>[a-zA-Z_:][a-zA-Z0-9_:]*)?\s*(?:\{(?P<matchers>.*)\})?\s*"
    r"(?:(?P<op>==|!=|>=|<=|>|<)\s*(?P<number>[-+]?[0-9.eE+-]+))?\s*$",
    re.S,
)
_MATCHER = re.compile(r'\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*(=~|!~|!=|=)\s*"((?:[^"\\]|\\.)*)"\s*(?:,|$)', re.S)
_COMPARE = {"==": operator.eq, "!=": operator.ne, ">": operator.gt, "<": operator.lt, ">=": operator.ge,
            "<=": operator.le}  # fmt: skip


def _unquote(text: str) -> str:
    return re.sub(r"\\(.)", lambda m: {"n": "\n", "t": "\t"}.get(m.group(1), m.group(1)), text)


def parse_selector(query: str) -> tuple[list[tuple[str, str, str]], tuple[str, float] | None] | None:
    """(matchers, comparison) of a query that is one vector selector, optionally compared with a number; else None.
    A matcher's regex that does not compile raises re.error."""
    m = _SELECTOR.match(query)
    if m is None or (not m.group("name") and m.group("matchers") is None):
        return None
    matchers: list[tuple[str, str, str]] = [("__name__", "=", m.group("name"))] if m.group("name") else []
    body, pos = (m.group("matchers") or "").strip(), 0
    while pos < len(body):
        mm = _MATCHER.match(body, pos)
        if mm is None:
            return None
        matchers.append((mm.group(1), mm.group(2), _unquote(mm.group(3))))
        if mm.group(2) in ("=~", "!~"):
            re.compile(matchers[-1][2])  # a bad regex is the query's error, as Prometheus parses it
        pos = mm.end()
    compare = None
    if m.group("op"):
        try:
            compare = (m.group("op"), float(m.group("number")))
        except ValueError:
            return None
    return matchers, compare


def _matches(labels: dict[str, str], matchers: list[tuple[str, str, str]]) -> bool:
    for label, op, want in matchers:
        have = labels.get(label, "")
        if op == "=" and have != want or op == "!=" and have == want:
            return False
        if op in ("=~", "!~") and (re.fullmatch(want, have) is not None) != (op == "=~"):
            return False
    return True


def _fmt(value: Any) -> str:
    v = float(value)
    if v != v:
        return "NaN"
    if v in (float("inf"), float("-inf")):
        return "+Inf" if v > 0 else "-Inf"
    return str(int(v)) if v.is_integer() and abs(v) < 1e15 else repr(v)


class PrometheusServer:
    def __init__(self) -> None:
        self.series: dict[str, dict] = {}
        self.samples: dict[tuple, dict] = {}  # raw series by their sorted labels
        self.requests: deque = deque(maxlen=10_000)
        self.app = web.Application()
        self.app.router.add_route("*", "/api/v1/query", self.query)
        self.app.router.add_route("*", "/_lab/series", self.admin_series)
        self.app.router.add_get("/_lab/requests", self.admin_requests)
        self.app.router.add_route("*", "/_lab/samples", self.admin_samples)
        self.app.router.add_get("/-/ready", self.ready)
        self.app.router.add_get("/-/healthy", self.ready)

    async def ready(self, request: web.Request) -> web.Response:
        return web.Response(text="Prometheus Server is Ready.\n")

    async def query(self, request: web.Request) -> web.Response:
        if request.method not in ("GET", "POST"):
            return _error(405, "bad_data", f"method {request.method} not allowed")
        params = dict(request.query)
        if request.method == "POST" and request.content_type == "application/x-www-form-urlencoded":
            params.update(await request.post())
        q = str(params.get("query") or "")
        self.requests.append({"time": time.time(), "query": q})
        if not q.strip():
            return _error(
                400,
                "bad_data",
                'invalid parameter "query": unknown position: parse error: no expression found in input',
            )
        ts = time.time()
        if params.get("time"):
            try:
                ts = float(params["time"])
            except ValueError:
                return _error(
                    400, "bad_data", f'invalid parameter "time": cannot parse "{params["time"]}" to a valid timestamp'
                )
        entry = self.series.get(q)
        if entry is None:
            try:
                result = self._evaluate(q, ts)
            except re.error as err:
                return _error(400, "bad_data", f"invalid regular expression in {q!r}: {err}")
        elif "error" in entry:
            return _error(int(entry.get("status", 400)), entry.get("errorType", "bad_data"), entry["error"])
        else:
            result = [
                {"metric": dict(r.get("metric") or {}), "value": _sample(r["value"], ts)} for r in entry["result"]
            ]
        return web.json_response({"status": "success", "data": {"resultType": "vector", "result": result}})

    def _evaluate(self, query: str, ts: float) -> list:
        parsed = parse_selector(query)
        if parsed is None:
            return []
        matchers, compare = parsed
        result = []
        for sample in self.samples.values():
            value = float(sample["value"])
            if not _matches(sample["metric"], matchers):
                continue
            if compare is not None and not _COMPARE[compare[0]](value, compare[1]):
                continue
            result.append({"metric": dict(sample["metric"]), "value": _sample(value, ts)})
        return result

    async def admin_samples(self, request: web.Request) -> web.Response:
        if request.method == "DELETE":
            self.samples.clear()
            return web.json_response({"ok": True})
        if request.method == "GET":
            return web.json_response({"samples": list(self.samples.values())})
        if request.method != "POST":
            return web.json_response({"error": "method not allowed"}, status=405)
        try:
            body = await request.json()
        except json.JSONDecodeError as e:
            return web.json_response({"error": f"bad JSON: {e}"}, status=400)
        samples = body.get("samples") if isinstance(body, dict) else None
        if not isinstance(samples, list):
            return web.json_response({"error": 'expected {"samples": [{metric, value}, ...]}'}, status=400)
        for item in samples:
            metric = item.get("metric") if isinstance(item, dict) else None
            if not isinstance(metric, dict) or not metric.get("__name__") or "value" not in item:
                return web.json_response({"error": "each sample needs metric.__name__ and value"}, status=400)
            key = tuple(sorted((str(k), str(v)) for k, v in metric.items()))
            if item["value"] is None:
                self.samples.pop(key, None)
            else:
                self.samples[key] = {"metric": dict(key), "value": float(item["value"])}
        return web.json_response({"ok": True, "count": len(self.samples)})

    async def admin_series(self, request: web.Request) -> web.Response:
        if request.method == "DELETE":
            self.series.clear()
            return web.json_response({"ok": True})
        if request.method == "GET":
            return web.json_response({"series": self.series})
        if request.method != "POST":
            return web.json_response({"error": "method not allowed"}, status=405)
        try:
            body = await request.json()
        except json.JSONDecodeError as e:
            return web.json_response({"error": f"bad JSON: {e}"}, status=400)
        items = body if isinstance(body, list) else [body]
        for item in items:
            if not isinstance(item, dict) or not isinstance(item.get("query"), str):
                return web.json_response({"error": "each entry needs a string 'query'"}, status=400)
            q = item["query"]
            if "error" in item:
                self.series[q] = {
                    "error": str(item["error"]),
                    "errorType": item.get("errorType", "bad_data"),
                    "status": int(item.get("status", 400)),
                }
            elif "result" in item:
                result = item["result"]
                if not isinstance(result, list) or not all(isinstance(r, dict) and "value" in r for r in result):
                    return web.json_response({"error": "'result' must be a list of {metric, value}"}, status=400)
                self.series[q] = {"result": result}
            elif "value" in item:
                if item["value"] is None:
                    self.series.pop(q, None)
                else:
                    self.series[q] = {"result": [{"metric": dict(item.get("metric") or {}), "value": item["value"]}]}
            else:
                return web.json_response({"error": "an entry needs one of value, result, error"}, status=400)
        return web.json_response({"ok": True, "count": len(self.series)})

    async def admin_requests(self, request: web.Request) -> web.Response:
        return web.json_response({"requests": list(self.requests)})


async def serve(host: str, port: int, ready_file: str | None) -> None:
    await serve_app("lab.prometheus", PrometheusServer().app, host, port, ready_file)


class PrometheusStub(ChildProcess):
    """``with PrometheusStub() as prom: prom.url`` — the stub as a child process (see ChildProcess)."""

    module = "lab.prometheus"
    name = "lab-prometheus"


class PrometheusAdmin:
    """Sync helper for tests: set and clear query answers."""

    def __init__(self, url: str, timeout: float = 10.0):
        import httpx

        self.url = url.rstrip("/")
        self._http = httpx.Client(base_url=self.url, timeout=timeout)

    def set(
        self,
        query: str,
        value: float | None = None,
        *,
        result: list[dict] | None = None,
        error: str | None = None,
        status: int = 400,
        error_type: str = "bad_data",
    ) -> None:
        body: dict[str, Any] = {"query": query}
        if error is not None:
            body.update(error=error, status=status, errorType=error_type)
        elif result is not None:
            body["result"] = result
        else:
            body["value"] = value
        self._http.post("/_lab/series", json=body).raise_for_status()

    def clear(self) -> None:
        self._http.delete("/_lab/series").raise_for_status()
        self._http.delete("/_lab/samples").raise_for_status()

    def set_samples(self, samples: list[dict]) -> None:
        """Raw series, as scraped: ``[{"metric": {"__name__": ..., label: value}, "value": 79}, ...]``."""
        self._http.post("/_lab/samples", json={"samples": samples}).raise_for_status()

    def requests(self) -> list[dict]:
        return self._http.get("/_lab/requests").json()["requests"]

    def close(self) -> None:
        self._http.close()


def main(argv: list[str] | None = None) -> int:
    a = server_arguments("python -m lab.prometheus", "Prometheus HTTP API stub").parse_args(argv)
    logging.basicConfig(level=a.log_level.upper(), stream=sys.stderr)
    asyncio.run(serve(a.host, a.port, a.ready_file))
    return 0


if __name__ == "__main__":
    sys.exit(main())
