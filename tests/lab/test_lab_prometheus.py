"""The Prometheus HTTP API stub: real response shapes, answers set by the test."""

from __future__ import annotations

import httpx


def test_query_shapes(prometheus_stub, prometheus):
    prometheus.set('sum(up{job="node"})', 3)
    prometheus.set(
        "gpu_errors",
        result=[{"metric": {"node": "n1"}, "value": 0.5}, {"metric": {"node": "n2"}, "value": [1700000000.0, "2"]}],
    )
    with httpx.Client(base_url=prometheus_stub.url) as http:
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
            "status": "success",
            "data": {"resultType": "vector", "result": []},
        }
        r = http.get("/api/v1/query", params={"query": ""})
        assert r.status_code == 400 and r.json()["status"] == "error" and r.json()["errorType"] == "bad_data"
    prometheus.set("broken(", error="1:8: parse error: unclosed left parenthesis")
    prometheus.set("empty", result=[])
    with httpx.Client(base_url=prometheus_stub.url) as http:
        r = http.get("/api/v1/query", params={"query": "broken("})
        assert r.status_code == 400
        assert r.json() == {
            "status": "error",
            "errorType": "bad_data",
            "error": "1:8: parse error: unclosed left parenthesis",
        }
        assert http.get("/api/v1/query", params={"query": "empty"}).json()["data"]["result"] == []
    assert [q["query"] for q in prometheus.requests()][-2:] == ["broken(", "empty"]


def test_bad_admin_input(prometheus_stub, prometheus):
    with httpx.Client(base_url=prometheus_stub.url) as http:
        assert http.post("/_lab/series", json={"value": 1}).status_code == 400
        assert http.post("/_lab/series", json={"query": "x"}).status_code == 400
        assert http.post("/_lab/series", json={"query": "x", "result": [{"metric": {}}]}).status_code == 400
        assert http.post("/_lab/samples", json={"samples": [{"metric": {"gpu": "0"}, "value": 1}]}).status_code == 400


def test_selectors_are_evaluated_over_raw_series(prometheus_stub, prometheus):
    def xid(node: str, gpu: str, value: float) -> dict:
        return {"metric": {"__name__": "DCGM_FI_DEV_XID_ERRORS", "Hostname": node, "gpu": gpu}, "value": value}

    prometheus.set_samples(
        [
            xid("n1", "0", 79),
            xid("n1", "1", 0),
            xid("n2", "0", 13),
            {"metric": {"__name__": "DCGM_FI_DEV_GPU_TEMP", "Hostname": "n1", "gpu": "0"}, "value": 60},
        ]
    )

    def ask(query: str) -> list[tuple[str, str, str, str]]:
        with httpx.Client(base_url=prometheus_stub.url) as http:
            body = http.post("/api/v1/query", data={"query": query}).json()
        assert body["status"] == "success", body
        return sorted((s["metric"]["__name__"], s["metric"]["Hostname"], s["metric"]["gpu"], s["value"][1])
                      for s in body["data"]["result"])  # fmt: skip

    assert ask('DCGM_FI_DEV_XID_ERRORS{Hostname="n1"}') == [("DCGM_FI_DEV_XID_ERRORS", "n1", "0", "79"),
                                                           ("DCGM_FI_DEV_XID_ERRORS", "n1", "1", "0")]  # fmt: skip
    assert ask('{__name__=~"DCGM_FI_DEV_XID_ERRORS|DCGM_FI_DEV_GPU_TEMP", Hostname=~"n\\\\d"} > 0') == [
        ("DCGM_FI_DEV_GPU_TEMP", "n1", "0", "60"),
        ("DCGM_FI_DEV_XID_ERRORS", "n1", "0", "79"),
        ("DCGM_FI_DEV_XID_ERRORS", "n2", "0", "13"),
    ]
    assert ask('DCGM_FI_DEV_XID_ERRORS{Hostname!="n1", gpu!~"1"} != 0') == [("DCGM_FI_DEV_XID_ERRORS", "n2", "0", "13")]
    assert ask('DCGM_FI_DEV_XID_ERRORS{Hostname=~"n"}') == []  # anchored, as Prometheus' regexes are
    assert ask("sum(DCGM_FI_DEV_XID_ERRORS)") == []  # not a selector: nothing the stub can evaluate
    prometheus.set_samples([{**xid("n2", "0", 0), "value": None}])  # dropped
    assert ask("DCGM_FI_DEV_XID_ERRORS > 0") == [("DCGM_FI_DEV_XID_ERRORS", "n1", "0", "79")]
    with httpx.Client(base_url=prometheus_stub.url) as http:
        r = http.post("/api/v1/query", data={"query": 'up{job=~"("}'})
        assert r.status_code == 400 and r.json()["errorType"] == "bad_data"
