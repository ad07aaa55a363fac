"""deploy/: the rendered overlays validate offline and match the worker's settings (no cluster)."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import tomllib

import kubernetes_validate
import pytest

from tests.deploy.manifests import (
    DEPLOY,
    OVERLAYS,
    REPO,
    container_env,
    host_agent,
    mounts,
    one,
    render,
    resolved_env,
    secret_env,
    unmounted_files,
    worker_container,
    worker_deployment,
)
from worker.config import WorkerSettings
from workflows.common.search_attributes import ALL as SEARCH_ATTRIBUTES

# Keep in step with deploy/README.md ("Supported Kubernetes versions").
KUBERNETES_VERSIONS = ["1.31.0", "1.32.0", "1.33.0"]
# Temporal's environment configuration (temporalio.envconfig) variables the manifests may set.
TEMPORAL_ENV = {
    "TEMPORAL_ADDRESS",
    "TEMPORAL_NAMESPACE",
    "TEMPORAL_API_KEY",
    "TEMPORAL_TLS",
    "TEMPORAL_TLS_CLIENT_CERT_PATH",
    "TEMPORAL_TLS_CLIENT_KEY_PATH",
    "TEMPORAL_TLS_SERVER_CA_CERT_PATH",
    "TEMPORAL_TLS_SERVER_NAME",
    "TEMPORAL_PROFILE",
    "TEMPORAL_CONFIG_FILE",
}
FILE_SETTINGS = ["TEMPORAL_TLS_CLIENT_CERT_PATH", "TEMPORAL_TLS_CLIENT_KEY_PATH", "TEMPORAL_TLS_SERVER_CA_CERT_PATH"]


def check_service_monitor(obj) -> None:
    """monitoring.coreos.com/v1 ServiceMonitor is a CRD: the fields we use, checked by hand."""
    assert obj["apiVersion"] == "monitoring.coreos.com/v1"
    assert set(obj) <= {"apiVersion", "kind", "metadata", "spec"}
    spec = obj["spec"]
    assert set(spec) <= {"selector", "namespaceSelector", "endpoints", "jobLabel", "targetLabels", "podTargetLabels"}
    assert isinstance(spec["selector"]["matchLabels"], dict) and spec["selector"]["matchLabels"]
    assert all(isinstance(n, str) for n in spec.get("namespaceSelector", {}).get("matchNames", []))
    for ep in spec["endpoints"]:
        assert set(ep) <= {"port", "path", "interval", "scrapeTimeout", "scheme", "honorLabels", "relabelings"}
        assert isinstance(ep["port"], str) and ep["path"].startswith("/")
        assert re.fullmatch(r"\d+[smh]", ep.get("interval", "30s"))


def validate_offline(objs, version: str) -> None:
    """Every rendered object against Kubernetes `version`'s schemas (strict), the ServiceMonitor by hand."""
    for obj in objs:
        if obj["kind"] == "ServiceMonitor":
            check_service_monitor(obj)
            continue
        try:
            kubernetes_validate.validate(obj, version, strict=True)
        except kubernetes_validate.ValidationError as err:
            pytest.fail(f"{obj['kind']} {obj['metadata']['name']} on {version}: {err.message} at {list(err.path)}")


@pytest.mark.parametrize("overlay", OVERLAYS)
@pytest.mark.parametrize("version", KUBERNETES_VERSIONS)
def test_rendered_objects_validate_offline(overlay, version):
    objs = render(f"overlays/{overlay}")
    kinds = {o["kind"] for o in objs}
    assert {
        "Namespace",
        "ServiceAccount",
        "ClusterRole",
        "ClusterRoleBinding",
        "Role",
        "RoleBinding",
        "ConfigMap",
        "Deployment",
        "PodDisruptionBudget",
        "Service",
        "ServiceMonitor",
        "Job",
        "DaemonSet",
    } <= kinds
    validate_offline(objs, version)


def test_readme_claims_the_validated_versions():
    text = (DEPLOY / "README.md").read_text()
    for v in KUBERNETES_VERSIONS:
        assert v.rsplit(".", 1)[0] in text


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_configmap_is_worker_settings_and_temporal_env(overlay):
    objs = render(f"overlays/{overlay}")
    container = worker_container(objs)
    env = container_env(objs, container)
    fields = set(WorkerSettings.model_fields)
    for key in env:
        if key.startswith("MILLWRIGHT_"):
            assert key.removeprefix("MILLWRIGHT_").lower() in fields, f"{key} is not a WorkerSettings field"
        else:
            assert key in TEMPORAL_ENV, f"{key}: neither MILLWRIGHT_* nor a Temporal env-config variable"
    settings = WorkerSettings(
        **{k.removeprefix("MILLWRIGHT_").lower(): v for k, v in env.items() if k.startswith("MILLWRIGHT_")}
    )
    assert settings.netbox_config() is not None and settings.ufm_config() is not None
    assert settings.bmc_credentials_ref() is not None
    assert env["TEMPORAL_ADDRESS"] and env["TEMPORAL_NAMESPACE"]
    if overlay == "temporal-cloud":
        assert secret_env(container) == {"TEMPORAL_API_KEY": ("millwright-temporal-api-key", "api-key")}
        assert not any(k.startswith("TEMPORAL_TLS_") for k in env)
    else:
        assert all(k in env for k in FILE_SETTINGS) and "TEMPORAL_API_KEY" not in secret_env(container)


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_every_referenced_file_is_mounted(overlay):
    objs = render(f"overlays/{overlay}")
    env = container_env(objs, worker_container(objs))
    assert "MILLWRIGHT_KUBECONFIG" in env and any(v.startswith("file:") for v in env.values())
    assert unmounted_files(objs) == []
    # Secrets only as files or secretKeyRef, never in a ConfigMap value.
    assert not any(re.search(r"(token|password|key)=", v, re.I) for v in env.values())


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_deployment_runs_the_worker_as_the_readme_says(overlay):
    objs = render(f"overlays/{overlay}")
    deployment = worker_deployment(objs)
    pod = deployment["spec"]["template"]["spec"]
    container = worker_container(objs)
    env = container_env(objs, container)
    scripts = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["scripts"]
    assert container["command"] == ["millwright-worker"] and "millwright-worker" in scripts
    assert deployment["spec"]["replicas"] >= 2
    assert pod["terminationGracePeriodSeconds"] > float(env["MILLWRIGHT_SHUTDOWN_GRACE_SECONDS"])
    port = int(env["MILLWRIGHT_METRICS_PORT"])
    assert env["MILLWRIGHT_METRICS_HOST"] == "0.0.0.0"
    named = {p["name"]: p["containerPort"] for p in container["ports"]}
    for probe in ("readinessProbe", "livenessProbe"):
        get = container[probe]["httpGet"]
        assert get["path"] == "/metrics" and named.get(get["port"], get["port"]) == port
    assert pod["securityContext"]["runAsNonRoot"] and pod["securityContext"]["runAsUser"] != 0
    assert container["securityContext"]["readOnlyRootFilesystem"]
    assert container["securityContext"]["allowPrivilegeEscalation"] is False
    assert "/tmp" in mounts(objs, pod, container)
    assert container["resources"]["requests"] and container["resources"]["limits"]["memory"]
    pdb = one(objs, "PodDisruptionBudget", "millwright-worker")
    assert pdb["spec"]["selector"]["matchLabels"].items() <= pod_labels(deployment).items()
    service = one(objs, "Service", "millwright-worker-metrics")
    assert service["spec"]["selector"].items() <= pod_labels(deployment).items()
    assert [p["targetPort"] for p in service["spec"]["ports"]] == ["metrics"]
    monitor = one(objs, "ServiceMonitor", "millwright-worker")
    assert monitor["spec"]["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
    sa = pod["serviceAccountName"]
    binding = one(objs, "ClusterRoleBinding", "millwright-worker")
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": sa, "namespace": "millwright"}]


def pod_labels(deployment):
    return deployment["spec"]["template"]["metadata"]["labels"]


def test_image_matches_the_pod_security_context_and_port():
    docker = (DEPLOY / "Dockerfile").read_text()
    objs = render("overlays/self-hosted")
    pod = worker_deployment(objs)["spec"]["template"]["spec"]
    froms = re.findall(r"^FROM (\S+)", docker, re.M)
    assert len(froms) == 2 and all(
        re.fullmatch(r"python:3\.11\.\d+-slim-\w+( AS \w+)?", f) or re.fullmatch(r"python:3\.11\.\d+-slim-\w+", f)
        for f in froms
    ), froms
    assert re.search(rf"^USER {pod['securityContext']['runAsUser']}:", docker, re.M)
    assert re.search(r"^EXPOSE 9464$", docker, re.M)
    assert 'ENTRYPOINT ["millwright-worker"]' in docker
    # Each image is one build of the Worker Deployment the ConfigMap names (docs/production.md, Upgrades).
    assert re.search(r"^ARG BUILD_ID$", docker, re.M) and "MILLWRIGHT_BUILD_ID=$BUILD_ID" in docker


def test_search_attribute_job_registers_every_attribute():
    objs = render("overlays/self-hosted")
    job = one(objs, "Job", "millwright-search-attributes")
    script = job["spec"]["template"]["spec"]["containers"][0]["args"][0]
    names = re.search(r"for name in ([\w ]+);", script).group(1).split()
    assert sorted(names) == sorted(k.name for k in SEARCH_ATTRIBUTES)
    assert all(k._metadata_type == "Keyword" for k in SEARCH_ATTRIBUTES)


# ---------------------------------------------------------------- the host agent (DaemonSet, systemd unit)

HOST_AGENT_COMMAND = ["python", "-m", "worker", "--host-agent"]
UNIT = DEPLOY / "host-agent" / "millwright-host-agent.service"


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_host_agent_daemonset_runs_on_every_gpu_node(overlay):
    objs = render(f"overlays/{overlay}")
    pod, container = host_agent(objs)
    assert container["command"] == HOST_AGENT_COMMAND
    assert pod["nodeSelector"] == {"nvidia.com/gpu.present": "true"} and pod["runtimeClassName"] == "nvidia"
    # cordoned, quarantined, NoExecute-tainted: still there (remediation runs on such nodes)
    assert {"operator": "Exists"} in pod["tolerations"]
    env = resolved_env(objs, container)
    assert env["MILLWRIGHT_HOST_NAME"] == ("field", "spec.nodeName")
    assert env["NVIDIA_VISIBLE_DEVICES"] == "all" and "utility" in env["NVIDIA_DRIVER_CAPABILITIES"].split(",")
    fields = set(WorkerSettings.model_fields) | {"host_name"}
    assert all(k.removeprefix("MILLWRIGHT_").lower() in fields for k in env if k.startswith("MILLWRIGHT_"))
    # No GPU request (it must not take GPUs from workloads), but bounded memory.
    assert not any("nvidia.com/gpu" in (container["resources"].get(k) or {}) for k in ("requests", "limits"))
    assert container["resources"]["requests"] and container["resources"]["limits"]["memory"]
    assert pod["securityContext"]["runAsNonRoot"] and container["securityContext"]["allowPrivilegeEscalation"] is False
    assert container["securityContext"]["readOnlyRootFilesystem"] and not container["securityContext"].get("privileged")
    assert pod["terminationGracePeriodSeconds"] > float(env["MILLWRIGHT_SHUTDOWN_GRACE_SECONDS"])
    get = container["livenessProbe"]["httpGet"]
    named = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert get["path"] == "/metrics" and named.get(get["port"], get["port"]) == int(env["MILLWRIGHT_METRICS_PORT"])


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_host_agent_connects_to_temporal_like_the_worker(overlay):
    """The same TEMPORAL_* values, API key Secret and TLS files as the worker Deployment."""
    objs = render(f"overlays/{overlay}")
    worker = worker_container(objs)
    worker_env = {**container_env(objs, worker), **{k: ("secret", *v) for k, v in secret_env(worker).items()}}
    pod, container = host_agent(objs)
    env = resolved_env(objs, container)
    temporal = {k: v for k, v in worker_env.items() if k.startswith("TEMPORAL_")}
    assert temporal and {k: v for k, v in env.items() if k.startswith("TEMPORAL_")} == temporal
    worker_mounts = mounts(objs, worker_deployment(objs)["spec"]["template"]["spec"], worker)
    agent_mounts = mounts(objs, pod, container)
    for key in FILE_SETTINGS:
        if key in env:
            directory = env[key].rsplit("/", 1)[0]
            assert agent_mounts[directory] == worker_mounts[directory], key


def unit_sections(text: str) -> dict[str, list[tuple[str, str]]]:
    """systemd unit syntax: [Section] headers, Key=Value lines (keys may repeat), # and ; comments."""
    sections: dict[str, list[tuple[str, str]]] = {}
    current = None
    for n, line in enumerate(text.splitlines(), 1):
        line = line.strip()
        if not line or line[0] in "#;":
            continue
        if line.startswith("[") and line.endswith("]"):
            current = sections.setdefault(line[1:-1], [])
            continue
        key, eq, value = line.partition("=")
        assert current is not None and eq and re.fullmatch(r"[A-Za-z][A-Za-z0-9_]*", key.strip()), f"line {n}: {line}"
        current.append((key.strip(), value.strip()))
    return sections


def test_host_agent_systemd_unit():
    sections = unit_sections(UNIT.read_text())
    assert set(sections) == {"Unit", "Service", "Install"}
    service = sections["Service"]
    values = dict(service)
    assert values["ExecStart"].split()[1:] == HOST_AGENT_COMMAND[1:]
    assert values["ExecStart"].split()[0].endswith("/python")
    assert values["EnvironmentFile"].startswith("/") and values["Restart"] == "always"
    assert float(values["TimeoutStopSec"]) > 60  # MILLWRIGHT_SHUTDOWN_GRACE_SECONDS in the env example
    # hardened, yet the GPUs stay reachable
    assert values["NoNewPrivileges"] == "yes" and values["ProtectSystem"] == "strict" and values["PrivateTmp"] == "yes"
    assert values.get("PrivateDevices", "no") == "no" and values["DevicePolicy"] == "closed"
    allowed = [v.split()[0] for k, v in service if k == "DeviceAllow"]
    assert "/dev/nvidiactl" in allowed and "char-nvidia-frontend" in allowed and "char-nvidia-uvm" in allowed
    assert ("WantedBy", "multi-user.target") in sections["Install"]
    example = dict(unit_sections("[Env]\n" + (DEPLOY / "host-agent" / "host-agent.env.example").read_text())["Env"])
    assert {"TEMPORAL_ADDRESS", "TEMPORAL_NAMESPACE"} <= set(example)
    assert float(example["MILLWRIGHT_SHUTDOWN_GRACE_SECONDS"]) < float(values["TimeoutStopSec"])


@pytest.mark.skipif(
    not shutil.which("systemd-analyze"), reason="systemd-analyze not installed (structure checked above)"
)
def test_host_agent_systemd_unit_verifies(tmp_path):
    """`systemd-analyze verify`, with ExecStart pointed at this venv's python (the unit's path is the image's)."""
    unit = tmp_path / UNIT.name
    text = UNIT.read_text()
    unit.write_text(re.sub(r"^ExecStart=\S+", f"ExecStart={sys.executable}", text, flags=re.M))
    out = subprocess.run(
        ["systemd-analyze", "verify", "--man=no", str(unit)], capture_output=True, text=True, timeout=60
    )
    complaints = [line for line in (out.stdout + out.stderr).splitlines() if UNIT.name in line]
    assert out.returncode == 0 and not complaints, out.stdout + out.stderr
