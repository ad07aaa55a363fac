"""Scale check of the emulator: ``python -m lab.k8s.scale --nodes 10000 --jobs 1000``.

Seeds N nodes (no pods), times paging through them (raw HTTP and the `list_nodes_page`
activity), then creates J Jobs on distinct nodes and times until all are Complete.
Prints measurements; asserts nothing.
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
import time
from pathlib import Path

import httpx
import yaml

from lab.fleet import Fleet
from lab.k8s.admin import EmulatorAdmin, kubeconfig
from lab.k8s.process import EmulatorProcess

NS = "millwright-system"


def job(name: str, node: str) -> dict:
    labels = {"millwright.dev/node": node, "millwright.dev/package": "bench", "millwright.dev/stage": "apply"}
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": name, "namespace": NS, "labels": labels},
        "spec": {
            "backoffLimit": 0,
            "ttlSecondsAfterFinished": 600,
            "template": {
                "metadata": {"labels": labels},
                "spec": {
                    "nodeName": node,
                    "restartPolicy": "Never",
                    "initContainers": [{"name": "apply", "image": "x:1"}],
                    "containers": [{"name": "apply-check", "image": "x:1"}],
                },
            },
        },
    }


async def main(nodes: int, jobs: int, job_seconds: float, concurrency: int) -> None:
    from temporalio.testing import ActivityEnvironment

    from activities.kube.activities import KubeActivities
    from activities.kube.connector import ClusterConnector
    from activities.kube.models import NodePageRequest

    with EmulatorProcess(pod_start_seconds=0.05, grace_scale=0.01, startup_timeout=60) as emu:
        admin = EmulatorAdmin(emu.url, timeout=600)
        fleet = Fleet.model_validate({"nodes": [{"prefix": "node-", "count": nodes, "digits": 5}], "namespaces": [NS]})
        t = time.monotonic()
        await admin.seed(fleet.to_objects())
        print(f"seed {nodes} nodes: {time.monotonic() - t:.2f}s")
        await admin.configure(jobs={"defaultSeconds": job_seconds, "rules": []})

        async with httpx.AsyncClient(base_url=emu.url, timeout=120) as http:
            t, pages, count, token, worst = time.monotonic(), 0, 0, None, 0.0
            while True:
                p0 = time.monotonic()
                r = await http.get("/api/v1/nodes", params={"limit": 500, **({"continue": token} if token else {})})
                worst = max(worst, time.monotonic() - p0)
                body = r.json()
                pages += 1
                count += len(body["items"])
                token = body["metadata"].get("continue")
                if not token:
                    break
            print(
                f"raw list_node limit=500: {count} nodes in {pages} pages, {time.monotonic() - t:.2f}s "
                f"(slowest page {worst * 1000:.0f} ms)"
            )

            with tempfile.TemporaryDirectory() as d:
                kc = Path(d) / "kubeconfig"
                kc.write_text(yaml.safe_dump(kubeconfig(emu.url, "lab")))
                connector = ClusterConnector([str(kc)])
                kube = KubeActivities(connector)
                env = ActivityEnvironment()
                t, count, token, pages = time.monotonic(), 0, None, 0
                while True:
                    page = await env.run(
                        kube.list_nodes_page, NodePageRequest(cluster="lab", limit=500, continue_token=token)
                    )
                    pages += 1
                    count += len(page.nodes)
                    token = page.continue_token
                    if not token:
                        break
                print(
                    f"list_nodes_page activity limit=500: {count} nodes in {pages} pages, {time.monotonic() - t:.2f}s"
                )
                await connector.close()

            t = time.monotonic()
            sem = asyncio.Semaphore(concurrency)
            step = max(1, nodes // jobs)

            async def create(i: int) -> None:
                async with sem:
                    r = await http.post(
                        f"/apis/batch/v1/namespaces/{NS}/jobs", json=job(f"bench-{i:05d}", f"node-{1 + i * step:05d}")
                    )
                    r.raise_for_status()

            await asyncio.gather(*(create(i) for i in range(jobs)))
            created = time.monotonic() - t
            print(f"create {jobs} Jobs on distinct nodes (concurrency {concurrency}): {created:.2f}s")
            polls, worst = 0, 0.0
            while True:
                p0 = time.monotonic()
                r = await http.get(f"/apis/batch/v1/namespaces/{NS}/jobs")
                worst = max(worst, time.monotonic() - p0)
                polls += 1
                done = sum(
                    1
                    for j in r.json()["items"]
                    if any(
                        c["type"] == "Complete" and c["status"] == "True"
                        for c in (j.get("status") or {}).get("conditions") or []
                    )
                )
                if done == jobs:
                    break
                await asyncio.sleep(0.5)
            total = time.monotonic() - t
            print(
                f"all {jobs} Jobs Complete {total:.2f}s after the first create (each runs {job_seconds}s "
                f"after a 0.05s pod start); {polls} list polls, slowest {worst * 1000:.0f} ms"
            )
            t = time.monotonic()
            r = await http.get("/api/v1/pods", params={"fieldSelector": f"spec.nodeName=node-{1 + step:05d}"})
            print(
                f"pods by spec.nodeName among {jobs} pods: {len(r.json()['items'])} in "
                f"{(time.monotonic() - t) * 1000:.1f} ms"
            )
        await admin.aclose()


if __name__ == "__main__":
    p = argparse.ArgumentParser()
    p.add_argument("--nodes", type=int, default=10_000)
    p.add_argument("--jobs", type=int, default=1_000)
    p.add_argument("--job-seconds", type=float, default=1.0)
    p.add_argument("--concurrency", type=int, default=50)
    a = p.parse_args()
    asyncio.run(main(a.nodes, a.jobs, a.job_seconds, a.concurrency))
