"""What a Job's emulated container printed (served at pods/<name>/log by lab/k8s/api.py, written by the kubelet):
that it started (its image, stage, node), its job rule's `log` lines, and how it ended. Kept in the simulator's side
table with the pod, so it goes when the pod goes, as in Kubernetes."""

from __future__ import annotations

from .util import now_rfc3339


def job_pod_log(side: dict) -> str:
    return "".join(f"{line}\n" for line in side.get("log") or [])


def log_line(side: dict, line: str) -> None:
    side.setdefault("log", []).append(f"{now_rfc3339()} {line}")
