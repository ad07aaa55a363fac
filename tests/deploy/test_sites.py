"""deploy/sites/: each site's worker overlay and the central worker with the site map render, validate offline, give
each site's worker only its own Secrets and settings, can be applied side by side, and start as docs/sites-and-
campaigns.md says (no cluster)."""

from __future__ import annotations

from typing import Any

import pytest
import yaml

from activities.sites import SiteMap, site_task_queue
from tests.deploy.manifests import (
    DEPLOY,
    container_env,
    one,
    render,
    secret_names,
    unmounted_files,
    worker_container,
    worker_deployment,
)
from tests.deploy.test_manifests import KUBERNETES_VERSIONS, TEMPORAL_ENV, validate_offline
from worker import registry
from worker.config import WorkerSettings

SITES = sorted(p.name for p in (DEPLOY / "sites").iterdir() if (p / "site.yaml").is_file())
CENTRAL = "sites/central"
SITE_SETTINGS = {"MILLWRIGHT_KUBECONFIG", "MILLWRIGHT_BMC_CREDENTIALS", "MILLWRIGHT_UFM_URL",
                 "MILLWRIGHT_UFM_CREDENTIALS", "MILLWRIGHT_IRONIC_URL", "MILLWRIGHT_IRONIC_TOKEN"}  # fmt: skip


def site_worker(objs, site: str) -> tuple[dict, dict]:
    """(Deployment, its container's plain env) of a site's worker."""
    name = f"millwright-site-{site}"
    return worker_deployment(objs, name), container_env(objs, worker_container(objs, name))


def settings_of(env: dict[str, str], **overrides: str) -> WorkerSettings:
    values: dict[str, Any] = {k.removeprefix("MILLWRIGHT_").lower(): v for k, v in env.items()
                              if k.startswith("MILLWRIGHT_")}  # fmt: skip
    return WorkerSettings(**{**values, **overrides})


def test_there_are_two_example_sites_and_the_central_map_names_exactly_them():
    assert SITES == ["east", "west"]
    objs = render(CENTRAL)
    env = container_env(objs, worker_container(objs))
    volume_dir, key = env["MILLWRIGHT_SITE_MAP"].rsplit("/", 1)
    pod = worker_deployment(objs)["spec"]["template"]["spec"]
    mount = next(m for m in pod["containers"][0]["volumeMounts"] if m["mountPath"] == volume_dir)
    config_map = next(v for v in pod["volumes"] if v["name"] == mount["name"])["configMap"]["name"]
    sites = SiteMap.model_validate_json(one(objs, "ConfigMap", config_map)["data"][key])
    assert sorted(sites.sites) == SITES
    assert all(sites.sites[s].clusters and sites.sites[s].bmcs for s in SITES)


@pytest.mark.parametrize("target", [*(f"sites/{s}" for s in SITES), CENTRAL])
@pytest.mark.parametrize("version", KUBERNETES_VERSIONS)
def test_site_overlays_validate_offline(target, version):
    validate_offline(render(target), version)


@pytest.mark.parametrize("site", SITES)
def test_a_sites_worker_runs_as_that_site_with_only_its_own_secrets(site):
    objs = render(f"sites/{site}")
    deployment, env = site_worker(objs, site)
    assert {o["kind"] for o in objs} == {"ServiceAccount", "ConfigMap", "Deployment", "PodDisruptionBudget"}
    for key in env:
        assert key.startswith("MILLWRIGHT_") or key in TEMPORAL_ENV, key
    settings = settings_of(env)
    assert settings.site == site and settings.site_map is None
    # Unversioned, like the host agent: a site's worker runs no workflow.
    assert "MILLWRIGHT_DEPLOYMENT_NAME" not in env and settings.bmc_credentials_ref() is not None
    assert unmounted_files(objs, f"millwright-site-{site}") == []
    # Only its own Secrets: each named for the site, the Temporal client certificate included.
    secrets = secret_names(objs)
    assert {f"millwright-site-{site}-{s}" for s in ("kubeconfig", "bmc", "temporal-tls")} <= secrets
    assert all(name.startswith(f"millwright-site-{site}-") for name in secrets), secrets
    pod = deployment["spec"]["template"]["spec"]
    # It reaches its clusters as its kubeconfig's identities, never as its pod's account.
    assert pod["automountServiceAccountToken"] is False
    assert one(objs, "ServiceAccount", pod["serviceAccountName"])["automountServiceAccountToken"] is False
    assert worker_container(objs, f"millwright-site-{site}")["command"] == ["millwright-worker"]
    assert pod["terminationGracePeriodSeconds"] > float(env["MILLWRIGHT_SHUTDOWN_GRACE_SECONDS"])


def test_two_sites_apply_side_by_side():
    """No object of one site's overlay is another's, no selector of one takes the other's pods, no Secret is shared."""
    rendered = {site: render(f"sites/{site}") for site in SITES}
    ids = {site: {(o["kind"], o["metadata"].get("namespace"), o["metadata"]["name"]) for o in objs}
           for site, objs in rendered.items()}  # fmt: skip
    east, west = SITES
    assert not ids[east] & ids[west]
    assert not secret_names(rendered[east]) & secret_names(rendered[west])
    for site, other in ((east, west), (west, east)):
        theirs = site_worker(rendered[other], other)[0]["spec"]["template"]["metadata"]["labels"]
        for obj in rendered[site]:
            selector = (obj["spec"].get("selector") or {}).get("matchLabels") if "spec" in obj else None
            if selector:
                assert not selector.items() <= theirs.items(), f"{site}'s {obj['kind']} selects {other}'s pods"


@pytest.mark.parametrize("site", SITES)
async def test_a_sites_worker_as_configured_registers_only_its_sites_systems(site, tmp_path):
    """Its settings, with the mounted kubeconfig written where the test can, build a site's registration: no
    workflow, the site's queue, only the integrations of a site."""
    from lab.k8s.admin import kubeconfig

    _, env = site_worker(render(f"sites/{site}"), site)
    path = tmp_path / "kubeconfig"
    path.write_text(yaml.safe_dump(kubeconfig("https://127.0.0.1:6443", f"{site}-gpu-a")))
    settings = settings_of(env, kubeconfig=str(path), metrics_port="0")
    registration = registry.build(settings)
    try:
        assert registration.workflows == [] and registration.task_queue == site_task_queue(site)
        assert all(integration.in_site for integration in registry.integrations_of(settings))
    finally:
        await registration.close()


async def test_the_central_worker_has_the_site_map_and_nothing_of_a_site(tmp_path):
    objs = render(CENTRAL)
    container = worker_container(objs)
    env = container_env(objs, container)
    assert not SITE_SETTINGS & set(env), SITE_SETTINGS & set(env)
    assert unmounted_files(objs) == []
    # No kubeconfig, BMC or UFM Secret, no Kubernetes roles, no token: it never calls a site's systems.
    assert not {"millwright-bmc", "millwright-ufm"} & secret_names(objs)
    assert not {o["kind"] for o in objs} & {"ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding"}
    pod = worker_deployment(objs)["spec"]["template"]["spec"]
    assert one(objs, "ServiceAccount", pod["serviceAccountName"])["automountServiceAccountToken"] is False
    # Its settings, with the site map where the pod mounts it, build a central registration with every workflow.
    volume_dir, key = env["MILLWRIGHT_SITE_MAP"].rsplit("/", 1)
    mount = next(m for m in container["volumeMounts"] if m["mountPath"] == volume_dir)
    config_map = next(v for v in pod["volumes"] if v["name"] == mount["name"])["configMap"]["name"]
    site_map = tmp_path / key
    site_map.write_text(one(objs, "ConfigMap", config_map)["data"][key])
    settings = settings_of(env, site_map=str(site_map), metrics_port="0")
    assert settings.site is None and settings.sites() is not None
    registration = registry.build(settings)
    try:
        assert registration.workflows and registration.task_queue is None
        assert not any(integration.in_site for integration in registry.integrations_of(settings))
    finally:
        await registration.close()
