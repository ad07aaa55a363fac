"""Rendering the deploy/ overlays and reading what the worker's pod is given."""

from __future__ import annotations

import functools
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
DEPLOY = REPO / "deploy"
OVERLAYS = ["self-hosted", "temporal-cloud"]


def kubectl() -> str | None:
    return shutil.which("kubectl")


@functools.cache
def _render(target: str) -> tuple[dict[str, Any], ...]:
    binary = kubectl()
    assert binary is not None, "rendering the manifests needs kubectl (the tests that call this skip without it)"
    out = subprocess.run([binary, "kustomize", str(DEPLOY / target)], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    return tuple(d for d in yaml.safe_load_all(out.stdout) if d)


def render(target: str) -> list[dict[str, Any]]:
    """The objects `kubectl apply -k deploy/<target>` would apply (kubectl kustomize)."""
    if not kubectl():
        pytest.skip("kubectl not installed: cannot render the Kustomize overlays")
    return list(_render(target))


def one(objs: list[dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    found = [o for o in objs if o["kind"] == kind and o["metadata"]["name"] == name]
    assert len(found) == 1, f"{kind} {name}: {len(found)} found"
    return found[0]


def worker_deployment(objs, name: str = "millwright-worker"):
    return one(objs, "Deployment", name)


def worker_container(objs, name: str = "millwright-worker") -> dict[str, Any]:
    return worker_deployment(objs, name)["spec"]["template"]["spec"]["containers"][0]


def container_env(objs, container: dict[str, Any]) -> dict[str, str]:
    """The plain env the container gets from envFrom ConfigMaps and literal env values."""
    env: dict[str, str] = {}
    for src in container.get("envFrom") or []:
        env.update(one(objs, "ConfigMap", src["configMapRef"]["name"]).get("data") or {})
    for item in container.get("env") or []:
        if "value" in item:
            env[item["name"]] = item["value"]
    return env


def secret_env(container: dict[str, Any]) -> dict[str, tuple[str, str]]:
    return {
        e["name"]: (e["valueFrom"]["secretKeyRef"]["name"], e["valueFrom"]["secretKeyRef"]["key"])
        for e in container.get("env") or []
        if "secretKeyRef" in (e.get("valueFrom") or {})
    }


def mounts(objs, pod_spec: dict[str, Any], container: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """mountPath -> the volume behind it."""
    volumes = {v["name"]: v for v in pod_spec.get("volumes") or []}
    return {
        m["mountPath"]: volumes[m["volumeName"] if "volumeName" in m else m["name"]]
        for m in container.get("volumeMounts") or []
    }


def unmounted_files(objs, name: str = "millwright-worker") -> list[str]:
    """The files the Deployment's settings name (`file:` references, TLS paths, the kubeconfig, the site map) that no
    volumeMount holds, or whose ConfigMap has no such key; [] when every one is there."""
    deployment = worker_deployment(objs, name)
    container = worker_container(objs, name)
    env = container_env(objs, container)
    mounted = mounts(objs, deployment["spec"]["template"]["spec"], container)
    paths = [p for k, p in env.items() if k.endswith("_PATH") and k.startswith("TEMPORAL_TLS_")]
    paths += [v.removeprefix("file:") for v in env.values() if v.startswith("file:")]
    paths += [p for k in ("MILLWRIGHT_KUBECONFIG", "MILLWRIGHT_SITE_MAP") for p in env.get(k, "").split(":") if p]
    missing = []
    for path in paths:
        dirs = [m for m in mounted if path.startswith(m.rstrip("/") + "/")]
        if not dirs:
            missing.append(f"{path} (under no volumeMount)")
            continue
        volume, key = mounted[dirs[0]], path[len(dirs[0]) + 1 :]
        if "configMap" in volume:
            if key not in (one(objs, "ConfigMap", volume["configMap"]["name"]).get("data") or {}):
                missing.append(f"{path} (no key {key} in ConfigMap {volume['configMap']['name']})")
        elif "secret" not in volume or "/" in key:
            missing.append(f"{path} (neither a ConfigMap key nor a Secret's)")
    return missing


def secret_names(objs) -> set[str]:
    """Every Secret the rendered pods mount or take env from."""
    names = set()
    for obj in objs:
        pod = obj.get("spec", {}).get("template", {}).get("spec", {})
        names |= {v["secret"]["secretName"] for v in pod.get("volumes") or [] if "secret" in v}
        for container in pod.get("containers") or []:
            names |= {name for name, _ in secret_env(container).values()}
    return names


def host_agent(objs) -> tuple[dict[str, Any], dict[str, Any]]:
    """(pod spec, container) of the host agent DaemonSet."""
    pod = one(objs, "DaemonSet", "millwright-host-agent")["spec"]["template"]["spec"]
    return pod, pod["containers"][0]


def resolved_env(objs, container: dict[str, Any]) -> dict[str, Any]:
    """Each env var as the kubelet resolves it: a literal or ConfigMap value (an optional key that is
    absent leaves the variable unset), ("secret", name, key) or ("field", path)."""
    env: dict[str, Any] = container_env(objs, {"envFrom": container.get("envFrom") or []})
    for item in container.get("env") or []:
        ref = item.get("valueFrom") or {}
        if "value" in item:
            env[item["name"]] = item["value"]
        elif "configMapKeyRef" in ref:
            cm = ref["configMapKeyRef"]
            data = one(objs, "ConfigMap", cm["name"]).get("data") or {}
            assert cm["key"] in data or cm.get("optional"), f"{item['name']}: {cm['name']} has no {cm['key']}"
            if cm["key"] in data:
                env[item["name"]] = data[cm["key"]]
        elif "secretKeyRef" in ref:
            env[item["name"]] = ("secret", ref["secretKeyRef"]["name"], ref["secretKeyRef"]["key"])
        elif "fieldRef" in ref:
            env[item["name"]] = ("field", ref["fieldRef"]["fieldPath"])
    return env
