"""deploy/: the rendered overlays validate offline and match the worker's settings (no cluster)."""

from __future__ import annotations

import re
import tomllib

import kubernetes_validate
import pytest

from worker.config import WorkerSettings
from workflows.search_attributes import ALL as SEARCH_ATTRIBUTES

from tests.deploy.manifests import (
    DEPLOY, OVERLAYS, REPO, container_env, mounts, one, render, secret_env, worker_container, worker_deployment,
)

# Keep in step with deploy/README.md ("Supported Kubernetes versions").
KUBERNETES_VERSIONS = ["1.31.0", "1.32.0", "1.33.0"]
# Temporal's environment configuration (temporalio.envconfig) variables the manifests may set.
TEMPORAL_ENV = {
    "TEMPORAL_ADDRESS", "TEMPORAL_NAMESPACE", "TEMPORAL_API_KEY", "TEMPORAL_TLS", "TEMPORAL_TLS_CLIENT_CERT_PATH",
    "TEMPORAL_TLS_CLIENT_KEY_PATH", "TEMPORAL_TLS_SERVER_CA_CERT_PATH", "TEMPORAL_TLS_SERVER_NAME",
    "TEMPORAL_PROFILE", "TEMPORAL_CONFIG_FILE",
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


@pytest.mark.parametrize("overlay", OVERLAYS)
@pytest.mark.parametrize("version", KUBERNETES_VERSIONS)
def test_rendered_objects_validate_offline(overlay, version):
    objs = render(f"overlays/{overlay}")
    kinds = {o["kind"] for o in objs}
    assert {"Namespace", "ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding", "ConfigMap",
            "Deployment", "PodDisruptionBudget", "Service", "ServiceMonitor", "Job"} <= kinds
    for obj in objs:
        if obj["kind"] == "ServiceMonitor":
            check_service_monitor(obj)
            continue
        try:
            kubernetes_validate.validate(obj, version, strict=True)
        except kubernetes_validate.ValidationError as err:
            pytest.fail(f"{obj['kind']} {obj['metadata']['name']} on {version}: {err.message} at {list(err.path)}")


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
    settings = WorkerSettings(**{k.removeprefix("MILLWRIGHT_").lower(): v
                                 for k, v in env.items() if k.startswith("MILLWRIGHT_")})
    assert settings.netbox_config() is not None and settings.ufm_config() is not None
    assert env["TEMPORAL_ADDRESS"] and env["TEMPORAL_NAMESPACE"]
    if overlay == "temporal-cloud":
        assert secret_env(container) == {"TEMPORAL_API_KEY": ("millwright-temporal-api-key", "api-key")}
        assert not any(k.startswith("TEMPORAL_TLS_") for k in env)
    else:
        assert all(k in env for k in FILE_SETTINGS) and "TEMPORAL_API_KEY" not in secret_env(container)


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_every_referenced_file_is_mounted(overlay):
    objs = render(f"overlays/{overlay}")
    deployment = worker_deployment(objs)
    container = worker_container(objs)
    env = container_env(objs, container)
    mounted = mounts(objs, deployment["spec"]["template"]["spec"], container)
    paths = [p for k, p in env.items() if k in FILE_SETTINGS]
    paths += [v.removeprefix("file:") for v in env.values() if v.startswith("file:")]
    paths += env["MILLWRIGHT_KUBECONFIG"].split(":")
    assert len(paths) >= 3
    for path in paths:
        dirs = [m for m in mounted if path.startswith(m.rstrip("/") + "/")]
        assert dirs, f"{path} is under no volumeMount"
        volume, key = mounted[dirs[0]], path[len(dirs[0]) + 1:]
        if "configMap" in volume:
            assert key in one(objs, "ConfigMap", volume["configMap"]["name"])["data"], path
        else:
            assert "secret" in volume and "/" not in key, path
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
    assert len(froms) == 2 and all(re.fullmatch(r"python:3\.11\.\d+-slim-\w+( AS \w+)?", f) or
                                    re.fullmatch(r"python:3\.11\.\d+-slim-\w+", f) for f in froms), froms
    assert re.search(rf"^USER {pod['securityContext']['runAsUser']}:", docker, re.M)
    assert re.search(r"^EXPOSE 9464$", docker, re.M)
    assert 'ENTRYPOINT ["millwright-worker"]' in docker


def test_search_attribute_job_registers_every_attribute():
    objs = render("overlays/self-hosted")
    job = one(objs, "Job", "millwright-search-attributes")
    script = job["spec"]["template"]["spec"]["containers"][0]["args"][0]
    names = re.search(r"for name in ([\w ]+);", script).group(1).split()
    assert sorted(names) == sorted(k.name for k in SEARCH_ATTRIBUTES)
    assert all(k._metadata_type == "Keyword" for k in SEARCH_ATTRIBUTES)

