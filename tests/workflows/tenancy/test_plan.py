"""OnboardTenant's plan (workflows/tenancy/plan.py), pure: the judgements the lab test does not reach on its own
cluster: a parent the operator labels, a `tenants` queue a person made, a person's object identical to the
desired one, a first admin group on an onboarded tenant, a `system:` user in a binding."""

from __future__ import annotations

import pytest
from temporalio.exceptions import ApplicationError

from activities.capi.models import GpuCapacity, LiveObject, ObjectRef, SurveyResult
from workflows.tenancy.models import AdminGroupChange, OnboardTenantInput
from workflows.tenancy.objects import tenant_steps
from workflows.tenancy.plan import QUEUE_ROLE_LABEL, TENANTS_PARENT_ROLE, plan_onboarding, survey_request

OWNER = "tenant/c/team"
CAP = GpuCapacity(gpus=16)


def onboarding(**kw) -> tuple[OnboardTenantInput, list[dict]]:
    inp = OnboardTenantInput.model_validate({"tenant": "team", "cluster": "c", "gpu": {"quota": 4}, **kw})
    return inp, [o for _, objs in tenant_steps(inp) for o in objs]


def absent(every: list[dict]) -> list[LiveObject]:
    return [LiveObject(ref=ObjectRef.of(o), exists=False) for o in every]


def parent(name: str = "tenants", owner: str | None = "cluster/c", labels: dict | None = None) -> LiveObject:
    ref = ObjectRef(api_version="scheduling.run.ai/v2", kind="Queue", name=name)
    return LiveObject(ref=ref, exists=True, owner=owner, labels=labels or {})


def plan(inp, every, objects, par=None, reserved=()):
    seen = SurveyResult(objects=[*objects, par or parent()], reserved_groups=list(reserved))
    assert [o.ref for o in seen.objects] == [ObjectRef.of(o) for o in every] + survey_request(inp, every).read
    return plan_onboarding(inp, OWNER, every, seen, CAP)


def refusal(*args, **kw) -> ApplicationError:
    with pytest.raises(ApplicationError) as err:
        plan(*args, **kw)
    assert err.value.non_retryable and err.value.message.endswith("nothing was written")
    return err.value


def test_a_parent_is_cluster_made_tenants_or_labelled_by_the_operator():
    inp, every = onboarding(parent_queue="research")
    labelled = parent("research", owner=None, labels={QUEUE_ROLE_LABEL: TENANTS_PARENT_ROLE})
    assert len(plan(inp, every, absent(every), labelled).create) == len(every)
    err = refusal(inp, every, absent(every), parent("research"))
    assert err.type == "InvalidTenantInput" and "parent_queue: Queue research is not a parent" in err.message
    inp, every = onboarding()
    err = refusal(inp, every, absent(every), parent(owner=None))
    assert "not created by Millwright" in err.message


def test_a_persons_identical_object_is_left_alone_a_differing_one_refused():
    inp, every = onboarding(namespaces=["team", "shared"])
    objects = absent(every)
    i = next(i for i, o in enumerate(every) if o["metadata"]["name"] == "shared" and o["kind"] == "Namespace")
    objects[i] = LiveObject(ref=objects[i].ref, exists=True, owner=None, differs=False)
    assert "Namespace shared" in plan(inp, every, objects).unchanged
    objects[i] = LiveObject(ref=objects[i].ref, exists=True, owner=None, differs=True)
    err = refusal(inp, every, objects)
    assert err.type == "ObjectConflict"
    assert "namespaces[1]: Namespace shared already exists on c (not created by Millwright)" in err.message


def test_a_first_admin_group_on_an_onboarded_tenant_is_a_change_too():
    inp, every = onboarding(admin_group="team-admins")
    objects = [LiveObject(ref=o.ref, exists=o.ref.kind in ("Namespace", "Queue"), owner=OWNER) for o in absent(every)]
    err = refusal(inp, every, objects)
    assert err.type == "AdminGroupChange" and "administered by no group" in err.message
    moved = inp.model_copy(update={"admin_group_change": AdminGroupChange(by="bob", reason="first admins")})
    change = plan(moved, every, objects).admin_group_change
    assert change is not None and change.previous == [] and change.admin_group == "team-admins"


def test_every_binding_subject_is_checked_against_reserved_and_system_identities():
    inp, every = onboarding(admin_group="platform")
    err = refusal(inp, every, absent(every), reserved=["platform"])
    assert err.type == "InvalidTenantInput" and err.message.startswith("admin_group: Group platform is reserved")
    binding = next(o for o in every if o["kind"] == "RoleBinding")
    binding["subjects"].append({"kind": "User", "name": "system:anonymous"})
    err = refusal(inp, every, absent(every))
    assert "admin_group: User system:anonymous is reserved" in err.message
