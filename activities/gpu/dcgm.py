"""``dcgmi diag -r N --json`` output (DCGM 3 and 4) as a :class:`DcgmDiag`: each test's worst status per GPU."""

from __future__ import annotations

import json

from activities.gpu.models import DcgmDiag, DcgmTestResult

_DCGM_STATUS = {"pass": "pass", "fail": "fail", "warn": "warn", "warning": "warn", "skip": "skip",
                "not run": "skip", "notrun": "skip", "not supported": "skip"}  # fmt: skip
_STATUS_RANK = {"skip": 0, "pass": 1, "warn": 2, "fail": 3}


def parse_dcgm_json(text: str, level: int | None = None) -> DcgmDiag:
    """`dcgmi diag -r N --json` output, per test (DCGM 3.x "DCGM GPU Diagnostic"/gpu_ids and 4.x
    "DCGM Diagnostic"/entity_id shapes)."""
    start, end = text.find("{"), text.rfind("}")
    try:
        body = json.loads(text[start : end + 1]) if start >= 0 else None
    except ValueError:
        body = None
    if not isinstance(body, dict):
        return DcgmDiag(level=level, passed=False, error=f"dcgmi output is not JSON: {text.strip()[:300]!r}")
    root = body.get("DCGM Diagnostic") or body.get("DCGM GPU Diagnostic") or body
    tests: list[DcgmTestResult] = []
    for category in root.get("test_categories") or []:
        for test in category.get("tests") or []:
            tests.append(_dcgm_test(str(category.get("category") or ""), test))
    error = root.get("runtime_error") or body.get("runtime_error")
    if not tests and not error:
        error = "no test results in dcgmi output"
    version = root.get("version") or (body.get("metadata") or {}).get("version")
    return DcgmDiag(level=level, passed=not error and all(t.status != "fail" for t in tests), tests=tests,
                    error=str(error) if error else None, version=str(version) if version else None)  # fmt: skip


def _dcgm_test(category: str, test: dict) -> DcgmTestResult:
    results = test.get("results") or []
    worst = "skip"
    by_status: dict[str, set[int]] = {}
    messages: list[str] = []
    for r in results:
        status = _DCGM_STATUS.get(str(r.get("status", "")).strip().lower(), "warn")
        worst = max(worst, status, key=_STATUS_RANK.__getitem__)
        gpus = _dcgm_gpus(r)
        by_status.setdefault(status, set()).update(gpus)
        warnings = r.get("warnings") or []
        if isinstance(warnings, (str, dict)):
            warnings = [warnings]
        for w in warnings:
            msg = w.get("warning") if isinstance(w, dict) else w
            if msg:
                where = f"GPU {','.join(map(str, sorted(gpus)))}: " if gpus else ""
                messages.append(f"{where}{str(msg).strip()}")
    if not results:
        summary = (test.get("test_summary") or {}).get("status")
        worst = _DCGM_STATUS.get(str(summary or "skip").strip().lower(), "warn")
    return DcgmTestResult(category=category, name=str(test.get("name") or "?"), status=worst,
                          gpus=sorted(by_status.get(worst, set())) if worst in ("fail", "warn") else [],
                          messages=list(dict.fromkeys(messages)))  # fmt: skip


def _dcgm_gpus(result: dict) -> set[int]:
    if "entity_id" in result:
        if str(result.get("entity_group", "GPU")).upper() != "GPU":
            return set()
        return {int(result["entity_id"])}
    ids = result.get("gpu_ids", result.get("gpu_id"))
    if ids is None:
        return set()
    if isinstance(ids, int):
        return {ids}
    if isinstance(ids, list):
        return {int(x) for x in ids}
    return {int(x) for x in str(ids).replace(" ", "").split(",") if x.isdigit()}
