"""The ownership the CAPI/KAI/vCluster activities write and read (activities/capi/), through ActivityEnvironment
against the Kubernetes emulator, no Temporal server: a retry after a lost answer knows its own run's write, an
identical object someone else made is left alone, and deletes by ownership touch only the owner's objects."""

from __future__ import annotations

import pytest
from temporalio.exceptions import ApplicationError
from temporalio.testing import ActivityEnvironment

from activities.capi.activities import ClusterApiActivities
from activities.capi.models import ApplyRequest, DeleteRequest, KindRef, ListRequest, ObjectRef
from activities.capi.ownership import OWNER_ANNOTATION, Ownership
from activities.kube.connector import ClusterConnector

pytestmark = pytest.mark.asyncio(loop_scope="session")

OWNER = "tenant/lab/own"
QUOTA_KIND = KindRef(api_version="v1", kind="ResourceQuota")


@pytest.fixture
async def capi(kubeconfig_path):
    connector = ClusterConnector([str(kubeconfig_path)])
    yield ClusterApiActivities(connector)
    await connector.close()


def quota(name: str, gpus: str = "1") -> dict:
    return {
        "apiVersion": "v1",
        "kind": "ResourceQuota",
        "metadata": {"name": name, "namespace": "own", "labels": {"millwright.dev/tenant": "own"}},
        "spec": {"hard": {"requests.nvidia.com/gpu": gpus}},
    }


async def apply(capi, run: str, *objs: dict) -> list[str]:
    req = ApplyRequest(cluster="lab", owner=OWNER, run=run, objects=list(objs), on_difference="update")
    return [o.outcome for o in (await ActivityEnvironment().run(capi.apply_objects, req)).outcomes]


async def live(k8s, name: str) -> dict:
    return next(o for o in await k8s.dump() if o["kind"] == "ResourceQuota" and o["metadata"]["name"] == name)


async def test_a_retry_after_lost_answers_reports_its_own_writes(k8s, capi):
    await k8s.seed([{"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "own"}}])
    # The create is done, its answer lost: the attempt fails; the retry (same run) finds it and says created.
    await k8s.add_fault({"verb": "create", "resource": "resourcequotas"}, {"drop": "after"})
    with pytest.raises(ApplicationError, match="connection failed"):
        await apply(capi, "run-1", quota("q"))
    assert await apply(capi, "run-1", quota("q")) == ["created"]
    assert await apply(capi, "run-2", quota("q")) == ["unchanged"]  # another run wrote nothing
    # The same for an update: run-3's retry knows its own write. (aiohttp resends a PUT whose kept-alive
    # connection dropped; the resend meets the new resourceVersion: 409, retryable like the drop itself.)
    await k8s.add_fault({"verb": "update", "resource": "resourcequotas"}, {"drop": "after"})
    with pytest.raises(ApplicationError, match=r"connection failed|409 Conflict") as lost:
        await apply(capi, "run-3", quota("q", "2"))
    assert not lost.value.non_retryable
    assert await apply(capi, "run-3", quota("q", "2")) == ["updated"]
    obj = await live(k8s, "q")
    assert obj["spec"]["hard"]["requests.nvidia.com/gpu"] == "2"
    assert Ownership.of(obj) == Ownership(workflow=OWNER, created_by="run-1", written_by="run-3")

    # A person's identical object is left alone (not adopted); a differing one is a conflict.
    person = quota("theirs")
    await k8s.seed([person])
    assert await apply(capi, "run-4", quota("theirs")) == ["unchanged"]
    assert OWNER_ANNOTATION not in ((await live(k8s, "theirs"))["metadata"].get("annotations") or {})
    with pytest.raises(ApplicationError, match="not created by Millwright") as err:
        await apply(capi, "run-4", quota("theirs", "3"))
    assert err.value.type == "ObjectConflict"


async def test_listing_and_deleting_by_ownership(k8s, capi):
    earlier = Ownership(workflow=OWNER, created_by="run-0", written_by="run-0")
    legacy = quota("legacy")  # an object written before runs were recorded: the bare workflow ID
    legacy["metadata"]["annotations"] = {OWNER_ANNOTATION: OWNER}
    other = quota("other")
    other["metadata"]["annotations"] = {OWNER_ANNOTATION: earlier.annotation()}
    await k8s.seed(
        [{"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "own"}}, quota("person"), legacy, other]
    )
    assert await apply(capi, "run-1", quota("mine")) == ["created"]
    env = ActivityEnvironment()
    mine = Ownership(workflow=OWNER, created_by="run-1")
    listed = await env.run(capi.list_objects, ListRequest(cluster="lab", kinds=[QUOTA_KIND], owned_by=mine))
    assert [r.name for r in listed] == ["mine"]
    ours = await env.run(
        capi.list_objects, ListRequest(cluster="lab", kinds=[QUOTA_KIND], owned_by=Ownership(workflow=OWNER))
    )
    assert sorted(r.name for r in ours) == ["legacy", "mine", "other"]

    refs = [
        ObjectRef(api_version="v1", kind="ResourceQuota", name=n, namespace="own")
        for n in ("mine", "person", "legacy", "other", "gone")
    ]
    done = await env.run(capi.delete_objects, DeleteRequest(cluster="lab", objects=refs, owned_by=mine))
    assert [r.name for r in done.deleted] == ["mine"] and [r.name for r in done.absent] == ["gone"]
    assert [r.name for r in done.kept] == ["person", "legacy", "other"]
    left = sorted(o["metadata"]["name"] for o in await k8s.dump() if o["kind"] == "ResourceQuota")
    assert left == ["legacy", "other", "person"]
    removed, kept = done.account(refs, listed)
    assert [r.name for r in removed] == ["mine"] and [r.name for r in kept] == ["person", "legacy", "other"]
