"""The Prometheus HTTP API stub: real response shapes, answers set by the test."""

from __future__ import annotations

import httpx
import pytest

from lab.prometheus import PrometheusAdmin, PrometheusStub


@pytest.fixture(scope="module")
def prom():
    with PrometheusStub() as stub:
        yield stub


@pytest.fixture
def admin(prom):
    a = PrometheusAdmin(prom.url)
    a.clear()
    yield a
    a.close()


def test_query_shapes(prom, admin):
    admin.set('sum(up{job="node"})', 3)
    admin.set("gpu_errors", result=[{"metric": {"node": "n1"}, "value": 0.5},
                                    {"metric": {"node": "n2"}, "value": [1700000000.0, "2"]}])
    with httpx.Client(base_url=prom.url) as http:
        r = http.get("/api/v1/query", params={"query": 'sum(up{job="node"})'})
        body = r.json()
        assert r.status_code == 200 and body["status"] == "success"
        assert body["data"]["resultType"] == "vector"
        (sample,) = body["data"]["result"]
        assert sample["metric"] == {} and sample["value"][1] == "3" and isinstance(sample["value"][0], float)
        r = http.post("/api/v1/query", data={"query": "gpu_errors"})
        res = r.json()["data"]["result"]
        assert [(s["metric"]["node"], s["value"][1]) for s in res] == [("n1", "0.5"), ("n2", "2")]
        assert res[1]["value"][0] == 1700000000.0
        assert http.get("/api/v1/query", params={"query": "unknown"}).json() == {
            "status": "success", "data": {"resultType": "vector", "result": []}}
        r = http.get("/api/v1/query", params={"query": ""})
        assert r.status_code == 400 and r.json()["status"] == "error" and r.json()["errorType"] == "bad_data"
    admin.set("broken(", error="1:8: parse error: unclosed left parenthesis")
    admin.set("empty", result=[])
    with httpx.Client(base_url=prom.url) as http:
        r = http.get("/api/v1/query", params={"query": "broken("})
        assert r.status_code == 400
        assert r.json() == {"status": "error", "errorType": "bad_data",
                            "error": "1:8: parse error: unclosed left parenthesis"}
        assert http.get("/api/v1/query", params={"query": "empty"}).json()["data"]["result"] == []
    assert [q["query"] for q in admin.requests()][-2:] == ["broken(", "empty"]


def test_bad_admin_input(prom, admin):
    with httpx.Client(base_url=prom.url) as http:
        assert http.post("/_lab/series", json={"value": 1}).status_code == 400
        assert http.post("/_lab/series", json={"query": "x"}).status_code == 400
        assert http.post("/_lab/series", json={"query": "x", "result": [{"metric": {}}]}).status_code == 400
