"""Bad input stops at the edge (issue #14): unknown fields at every depth, URLs that are not URLs.

- The JSON Schemas `millwright schema` exports, and every update's and signal's argument schema, refuse unknown
  fields in every object they describe.
- A misspelt nested field of every startable workflow is refused, naming its full path, by `millwright start`
  (exit 2), by `parse_input` (InputError) and by the worker when the JSON comes straight to the server as from the
  Temporal UI (the run fails in its first workflow task, nothing scheduled); the Kubernetes emulator's audit log
  shows Millwright made no request at all.
- A misspelt field in any update's argument is rejected naming it, and the run goes on.
- URL fields take only real http(s) URLs; the shipped burn-in example's placeholder is refused, naming the field.
- Every model refuses unknown fields but those that parse another system's answer or payload whole (`FOREIGN`,
  activities/models.py ForeignModel), which ignore them: a newer release of that system adds fields.
"""

from __future__ import annotations

import asyncio
import copy
import inspect
import json
import re
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pydantic
import pytest
from pydantic import BaseModel, TypeAdapter
from temporalio.api.enums.v1 import EventType
from temporalio.client import WorkflowFailureError, WorkflowUpdateFailedError
from temporalio.exceptions import ApplicationError
from temporalio.service import RPCError, RPCStatusCode
from temporalio.workflow import _Definition
from typer.testing import CliRunner

from activities.registration import activity_methods
from starter.cli import app
from starter.client import InputError, parse_input, workflow_specs
from tests.cli_in_process import cli
from tests.kube_helpers import fleet_objects
from workflows.catalog import WORKFLOWS

in_session_loop = pytest.mark.asyncio(loop_scope="session")

REPO = Path(__file__).resolve().parents[1]
EXAMPLES = REPO / "examples"
BMC = "http://127.0.0.1:8000"  # a BMC URL of the right shape; nothing is called in these tests


def example(name: str, **changes: Any) -> dict[str, Any]:
    return {**json.loads((EXAMPLES / name).read_text()), **changes}


def burn_in_server() -> dict[str, Any]:
    server = example("server-burn-in.json")["server"]
    return {**server, "bmc": {**server["bmc"], "url": BMC}}


def firmware_server() -> dict[str, Any]:
    return {k: v for k, v in burn_in_server().items() if k != "expected"}


# ================================================================= every object schema refuses unknown fields

# Where free keys with free values are what the other system takes, and it checks them itself.
FREE_OBJECTS = {
    "CleanStep.properties.args": "an Ironic clean step's own arguments, passed as given; Ironic refuses the ones "
                                 "the step does not declare (its argsinfo)",
    "NodeWork.properties.input": "a fleet batch's per-node child input, passed on as given; the child's own model "
                                 "refuses unknown fields when it starts",
    "properties.outputs": "RolloutBatch's per-node children's results carried across continue-as-new, as the "
                          "children returned them",
}  # fmt: skip
_DATA_KEYWORDS = {"default", "examples", "const", "enum", "title", "description", "pattern", "format"}
_SCHEMA_MAPS = {"properties", "$defs", "patternProperties", "dependentSchemas"}


def loose_objects(schema: Any, path: str = "") -> tuple[list[str], int]:  # noqa: C901 (one branch per JSON Schema construct an object can hide in)
    """Paths of the object schemas in ``schema`` that admit fields they do not describe, and how many objects
    were checked. A dict[str, X] (``additionalProperties``: X's schema) is fine when X is strict; Any is not."""
    loose: list[str] = []
    objects = 0

    def free(sub: Any, where: str) -> None:  # a place a schema goes, holding "anything"
        if sub is True or sub == {}:
            loose.append(where)

    def walk(node: Any, where: str) -> None:
        nonlocal objects
        if isinstance(node, list):
            for i, item in enumerate(node):
                walk(item, f"{where}[{i}]")
            return
        if not isinstance(node, dict):
            return
        types = node.get("type")
        if types == "object" or (isinstance(types, list) and "object" in types) or "properties" in node:
            objects += 1
            extra = node.get("additionalProperties", True)  # JSON Schema's default: any other field goes
            if "properties" in node and extra is not False:
                loose.append(where or "(root)")
            elif "properties" not in node:
                free(extra, f"{where}.additionalProperties")
        for key, value in node.items():
            if key in _DATA_KEYWORDS:
                continue
            if key in _SCHEMA_MAPS and isinstance(value, dict):
                for name, sub in value.items():
                    if key == "properties":
                        free(sub, f"{where}.{key}.{name}".lstrip("."))
                    walk(sub, f"{where}.{key}.{name}".lstrip("."))
            else:
                if key in ("items", "additionalProperties"):
                    free(value, f"{where}.{key}")
                walk(value, f"{where}.{key}".lstrip("."))

    walk(schema, path)
    return sorted(set(loose)), objects


def free_by_design(path: str) -> str | None:
    """The FREE_OBJECTS entry that allows ``path``, if any."""
    return next((k for k in FREE_OBJECTS if path.removesuffix(".additionalProperties").endswith(k)), None)


def exported_input_schemas() -> dict[str, dict[str, Any]]:
    """The input schemas exactly as `millwright schema` prints them."""
    result = CliRunner().invoke(app, ["schema"])
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    return {w["name"]: doc["schemas"][w["input"]] for w in doc["index"]["workflows"]}


def handler_arg_types() -> dict[str, list[type]]:
    """Every update's and signal's argument types, by `Workflow.update` name, for every registered workflow."""
    out: dict[str, list[type]] = {}
    for cls in WORKFLOWS:
        defn = _Definition.must_from_class(cls)
        for kind, handlers in (("update", defn.updates), ("signal", defn.signals)):
            for name, handler in handlers.items():
                assert name, f"{defn.name}: a dynamic {kind} handler takes any argument; give it a name and a model"
                params = [p for p in inspect.signature(handler.fn).parameters if p != "self"]
                types = list(handler.arg_types or [])
                assert len(types) == len(params), f"{defn.name}.{name}: cannot see its argument types"
                out[f"{defn.name}.{name} ({kind})"] = types
    return out


def test_the_walker_finds_what_admits_unknown_fields():
    class Free(BaseModel):  # not a StrictModel
        name: str

    class Holder(BaseModel):
        model_config = pydantic.ConfigDict(extra="forbid")
        free: Free
        anything: dict[str, Any] = {}
        frees: dict[str, list[Free]] = {}
        either: int | Free = 0

    loose, objects = loose_objects(TypeAdapter(Holder).json_schema())
    assert loose == ["$defs.Free", "properties.anything.additionalProperties"], loose
    assert objects == 4  # Holder, Free and the two dicts


def test_every_workflow_input_schema_refuses_unknown_fields():
    schemas = exported_input_schemas()
    assert set(schemas) == set(workflow_specs()) and len(schemas) >= 15
    for cls in WORKFLOWS:  # the children and entities other workflows start, as they would be typed into the UI
        defn = _Definition.must_from_class(cls)
        if defn.name not in schemas:
            [arg] = defn.arg_types or []
            schemas[defn.name] = TypeAdapter(arg).json_schema()
    checked, allowed = 0, set()
    for name, schema in sorted(schemas.items()):
        loose, objects = loose_objects(schema)
        unexpected = [path for path in loose if not free_by_design(path)]
        assert unexpected == [], f"{name}: object schemas that admit unknown fields: {unexpected}"
        allowed |= {free_by_design(path) for path in loose}
        checked += objects
    assert checked > 100, checked
    assert allowed == set(FREE_OBJECTS), "FREE_OBJECTS lists a field that no longer exists"


def test_every_update_and_signal_argument_schema_refuses_unknown_fields():
    handlers = handler_arg_types()
    assert "NodeMaintenance.abort (update)" in handlers and "RolloutBatch.pause (signal)" in handlers
    for name, types in sorted(handlers.items()):
        for arg in types:
            schema = TypeAdapter(arg).json_schema()
            loose, objects = loose_objects(schema)
            assert objects and loose == [], (
                f"{name}: {arg.__name__} admits unknown fields at {loose or '(not an object)'}"
            )


# ================================================================= operator inputs refuse, other systems' answers don't

# The models that parse another system's answer or payload whole (activities/models.py ForeignModel): they ignore
# fields they do not know, as a newer release of that system adds them. Every other model refuses them.
FOREIGN = {
    "worker.alert_receiver.AlertmanagerPayload": "Alertmanager's webhook payload (Alertmanager never retries a 4xx)",
    "worker.alert_receiver.Alert": "one alert of it",
}


def millwright_models() -> dict[str, type[BaseModel]]:
    """Every pydantic model the worker's packages define, by dotted name."""
    import importlib
    import pkgutil

    for package in ("activities", "worker", "workflows"):
        for info in pkgutil.walk_packages([str(REPO / package)], f"{package}."):
            if not info.name.endswith(".__main__"):  # `python -m worker` would start a worker
                importlib.import_module(info.name)
    found: dict[str, type[BaseModel]] = {}
    todo = list(BaseModel.__subclasses__())
    while todo:
        cls = todo.pop()
        todo += cls.__subclasses__()
        if cls.__module__.split(".")[0] in ("activities", "worker", "workflows"):
            found[f"{cls.__module__}.{cls.__qualname__}"] = cls
    return found


def test_every_model_refuses_unknown_fields_but_the_listed_answers_of_other_systems():
    from activities.models import ForeignModel, StrictModel
    from activities.support.integration import SystemSettings

    models = millwright_models()
    assert len(models) > 300 and set(FOREIGN) <= set(models), sorted(set(FOREIGN) - set(models))
    foreign = {name for name, cls in models.items() if issubclass(cls, ForeignModel) and cls is not ForeignModel}
    assert foreign == set(FOREIGN), f"a ForeignModel not in FOREIGN, or listed and not one: {foreign ^ set(FOREIGN)}"
    # The worker's settings (worker/config.py and the integrations' SystemSettings it is made of) are read from an
    # environment that holds every other program's variables too; worker/config.py checks its own.
    lax = [name for name, cls in models.items() if name not in FOREIGN and cls is not ForeignModel
           and not issubclass(cls, SystemSettings) and cls.model_config.get("extra") != "forbid"]  # fmt: skip
    assert lax == [], f"models that are neither strict nor listed answers of another system: {lax}"
    assert StrictModel.model_config["extra"] == "forbid" and ForeignModel.model_config["extra"] == "ignore"


def test_url_fields_are_validated_as_urls():
    """Every `*url` field that comes from outside is a BaseUrl (its schema says format uri)."""
    from worker.config import WorkerSettings

    schemas = {**exported_input_schemas(), "worker settings": WorkerSettings.model_json_schema()}
    found = []

    def walk(node: Any, where: str) -> None:
        if isinstance(node, dict):
            for name, sub in (node.get("properties") or {}).items():
                if name.lower().endswith("url"):
                    arms = [a for a in sub.get("anyOf", [sub]) if a.get("type") != "null"]
                    found.append(f"{where}.{name}")
                    assert [a.get("format") for a in arms] == ["uri"], f"{where}.{name} is not a BaseUrl: {sub}"
            for key, value in node.items():
                if key not in _DATA_KEYWORDS:
                    walk(value, f"{where}.{key}" if key == "$defs" or where.endswith("$defs") else where)
        elif isinstance(node, list):
            for item in node:
                walk(item, where)

    for name, schema in schemas.items():
        walk(schema, name)
    for expected in ("BmcRef.url", "WebhookTarget.url", "PrometheusGate.url", "image_url", "netbox_url"):
        assert any(f.endswith(expected) for f in found), (expected, found)


# ================================================================= a nested typo, every startable workflow


@dataclass(frozen=True)
class Typo:
    valid: dict[str, Any]  # an input the workflow takes
    at: tuple[str | int, ...]  # the object the misspelt field goes into; () only where the input nests no object
    field: str  # the misspelling

    @property
    def path(self) -> str:
        return ".".join(str(p) for p in (*self.at, self.field))

    def bad(self) -> dict[str, Any]:
        data = copy.deepcopy(self.valid)
        target: Any = data
        for part in self.at:
            target = target[part]
        target[self.field] = True
        return data


TYPOS: dict[str, Typo] = {
    # The case, on a node the emulator has: had it been accepted, the node would have been cordoned.
    "NodeMaintenance": Typo(example("node-maintenance.json", node="node-04"), ("drain",), "delete_empty_dir_data"),
    "Rollout": Typo(example("rollout.json"), ("deploymentPolicy", "default", "strategy", "exponential"),
                    "initialBatchSize"),
    "InventoryBootstrap": Typo({}, (), "section"),
    "IsolateTenant": Typo({"fabric": "lab-ib", "tenant": "nlp", "hosts": ["node-01"]}, (), "membershp"),
    "ReleaseTenant": Typo({"fabric": "lab-ib", "tenant": "nlp"}, (), "netbx"),
    "FabricAudit": Typo({"fabric": "lab-ib", "carried": {}}, ("carried",), "aftr"),
    "CreateCluster": Typo(example("tenant-cluster.json"), ("worker_pools", 0), "gpus_per_nodes"),
    "DeleteCluster": Typo({"name": "gpu-a"}, (), "forse"),
    "OnboardTenant": Typo(example("tenant-recommender.json", cluster="lab"), ("gpu",), "over_quota_wieght"),
    "OffboardTenant": Typo({"tenant": "recommender", "cluster": "lab"}, (), "worklods_timeout"),
    "UpdateTenantQuota": Typo(example("tenant-nlp-quota.json", cluster="lab"), ("gpu",), "limits"),
    "ServerBurnIn": Typo({**example("server-burn-in.json"), "server": burn_in_server()}, ("server", "bmc"),
                         "verify_ssl"),
    "FleetBurnIn": Typo({"name": "rack-a", "servers": [burn_in_server()], "settings": {"record_in_netbox": False}},
                        ("servers", 0, "expected"), "gpu_modle"),
    "FleetHealthSweep": Typo(example("fleet-health-sweep.json", bmcs={"node-03": {"url": BMC}}), ("bmcs", "node-03"),
                             "verify_ssl"),
    "NodeRemediation": Typo(example("node-remediation.json", node="node-03"), ("webhook",), "tokn"),
    "TenantUsage": Typo({"cluster": "lab", "period": "PT1H"}, (), "perod"),
    "NodeRma": Typo({"cluster": "lab", "node": "node-03", "ticket": {"url": "http://127.0.0.1:9/hooks/rma"}},
                    ("ticket",), "tokn"),
    "FirmwareUpdate": Typo({**example("firmware-update.json"), "server": firmware_server()},
                           ("bundle", "components", 0), "imageuri"),
    "GpuPartitioning": Typo(example("gpu-partitioning.json", nodes=["node-04"]), ("drain",), "gpu_only"),
    "FleetFirmwareUpdate": Typo({**example("fleet-firmware-update.json"), "servers": [firmware_server()]},
                                ("waves",), "batch_size"),
    "FleetRollout": Typo(example("fleet-rollout.json"), ("rollout", "drainConfig"), "deleteEmptyDirDta"),
    "FleetGpuPartitioning": Typo(example("fleet-gpu-partitioning.json", partitioning={
        **example("fleet-gpu-partitioning.json")["partitioning"], "nodes": ["node-04"]}), ("partitioning", "drain"),
                                 "gpu_only"),
    "FirmwareCampaign": Typo(example("firmware-campaign.json"), ("firmware", "kubernetes", "drain"),
                             "delete_empty_dir_data"),
    "RackRemediation": Typo({"cluster": "lab", "domain": "rack-001", "reason": "NVLink fabric down",
                             "bmcs": {"node-03": {"url": BMC}}, "domain_check": {"timeout": "PT5M"}},
                            ("domain_check",), "imge"),
}  # fmt: skip


def nests_objects(schema: dict[str, Any]) -> bool:
    """Whether the input holds an object below its top level (a model, a dict; directly, in a list or a union)."""
    return loose_objects(schema)[1] > 1


def test_every_startable_workflow_has_a_typo_case_nested_where_it_can_be():
    schemas = exported_input_schemas()
    assert set(TYPOS) == set(schemas), "add a Typo for each new startable workflow (and drop removed ones)"
    for name, typo in TYPOS.items():
        if nests_objects(schemas[name]):
            assert typo.at, f"{name}'s input nests objects: put its typo inside one"


@pytest.mark.parametrize("name", sorted(TYPOS))
def test_parse_input_names_the_misspelt_field_by_its_full_path(name):
    typo = TYPOS[name]
    parse_input(name, typo.valid)  # the valid input is taken: the typo alone is refused below
    with pytest.raises(InputError) as refused:
        parse_input(name, typo.bad())
    assert refused.value.errors[0].startswith(f"{typo.path}: Extra inputs are not permitted"), refused.value.errors
    assert refused.value.workflow == name


def test_a_typo_names_the_field_it_was_meant_to_be():
    bad = {"cluster": "lab", "node": "node-04", "reasn": "x", "drain": {"delete_empty_dir_data": True}}
    with pytest.raises(InputError) as refused:
        parse_input("NodeMaintenance", bad)
    assert refused.value.errors == [  # unknown fields first: the misspelling is why `reason` is missing
        "drain.delete_empty_dir_data: Extra inputs are not permitted; did you mean 'delete_emptydir_data'?",
        "reasn: Extra inputs are not permitted; did you mean 'reason'?",
        "reason: Field required",
    ]


async def millwright_requests(k8s, since: int) -> list[dict]:
    """What Millwright asked the Kubernetes emulator since `since` (reads and writes; the lab's own controllers
    are not Millwright)."""
    return [e for e in await k8s.audit(since=since) if e.get("userAgent", "").startswith("millwright")]


@in_session_loop
async def test_a_typo_stops_at_every_edge_before_anything_runs(client, kube_worker, k8s, temporal_address):
    """CLI, client library and a start straight to the server (the UI's way), for every startable workflow, with
    a real worker on the queue that would have run them."""
    await k8s.seed(fleet_objects())
    since = await k8s.audit_cursor()
    queue, tag = kube_worker.task_queue, uuid.uuid4().hex[:6]

    runner = CliRunner()
    for name, typo in sorted(TYPOS.items()):
        wf_id = f"typo-cli-{name}-{tag}"
        result = runner.invoke(app, ["start", name, "--input", "-", "--id", wf_id, "--address", temporal_address,
                                     "--task-queue", queue], input=json.dumps(typo.bad()))  # fmt: skip
        assert result.exit_code == 2, (name, result.output)
        assert "nothing was started" in result.stderr, (name, result.stderr)
        assert re.search(rf"^  {re.escape(typo.path)}: Extra inputs are not permitted", result.stderr, re.M), (
            name, result.stderr)  # fmt: skip
        with pytest.raises(RPCError) as missing:
            await client.get_workflow_handle(wf_id).describe()
        assert missing.value.status == RPCStatusCode.NOT_FOUND, name

    # The real entry point, as users run it, for the issue's own case.
    result = await cli("start", "NodeMaintenance", "--input", "-", "--address", temporal_address, "--task-queue",
                       queue, stdin=json.dumps(TYPOS["NodeMaintenance"].bad()))  # fmt: skip
    assert result.returncode == 2 and "  drain.delete_empty_dir_data: Extra inputs" in result.stderr, result

    async def from_the_ui(name: str, typo: Typo) -> None:
        handle = await client.start_workflow(name, typo.bad(), id=f"typo-ui-{name}-{tag}", task_queue=queue)
        with pytest.raises(WorkflowFailureError) as failed:
            await asyncio.wait_for(handle.result(), 30)
        cause = failed.value.cause
        assert isinstance(cause, ApplicationError), (name, cause)
        assert cause.type == "ValidationError" and typo.path in cause.message, (name, cause)
        assert "Extra inputs are not permitted" in cause.message, (name, cause.message)
        events = [EventType.Name(e.event_type) for e in (await handle.fetch_history()).events]
        assert events == [  # failed in its first workflow task: no retry, no activity, no timer, no child
            "EVENT_TYPE_WORKFLOW_EXECUTION_STARTED", "EVENT_TYPE_WORKFLOW_TASK_SCHEDULED",
            "EVENT_TYPE_WORKFLOW_TASK_STARTED", "EVENT_TYPE_WORKFLOW_TASK_COMPLETED",
            "EVENT_TYPE_WORKFLOW_EXECUTION_FAILED",
        ], (name, events)  # fmt: skip

    await asyncio.gather(*(from_the_ui(name, typo) for name, typo in sorted(TYPOS.items())))
    assert await millwright_requests(k8s, since) == []


# ================================================================= a typo in an operator control


def misspelt(field: str) -> str:
    """`reason` -> `reasn`: the second-to-last letter dropped."""
    return field[:-2] + field[-1]


# A running instance of every registered workflow that takes updates: a worker without activities keeps each one
# waiting at its first activity. An update's argument is decoded, and refused, before any validator or state.
RUNNING: dict[str, dict[str, Any]] = {
    "NodeMaintenance": TYPOS["NodeMaintenance"].valid,
    "Rollout": TYPOS["Rollout"].valid,
    "GpuPartitioning": TYPOS["GpuPartitioning"].valid,
    "FleetBurnIn": TYPOS["FleetBurnIn"].valid,
    "FleetFirmwareUpdate": TYPOS["FleetFirmwareUpdate"].valid,
    "NodeRemediation": TYPOS["NodeRemediation"].valid,
    "NodeRma": TYPOS["NodeRma"].valid,
    "RackRemediation": TYPOS["RackRemediation"].valid,
    "FleetRollout": TYPOS["FleetRollout"].valid,
    "FleetGpuPartitioning": TYPOS["FleetGpuPartitioning"].valid,
    "FirmwareCampaign": TYPOS["FirmwareCampaign"].valid,
    "Fabric": {"fabric": "lab-ib"},
    "DisruptionBudget": {"cluster": "lab"},
}


@in_session_loop
async def test_a_misspelt_update_field_is_rejected_naming_it_and_the_run_goes_on(client, kubeconfig_path):
    from worker import registry
    from workflows.maintenance.node_maintenance import AbortRequest, NodeMaintenance

    with_updates = [cls for cls in WORKFLOWS if _Definition.must_from_class(cls).updates]
    updates = {defn.name: defn.updates for defn in map(_Definition.must_from_class, with_updates)}
    assert set(updates) == set(RUNNING), "give RUNNING an input for each workflow with updates"
    queue, tag = f"typo-updates-{uuid.uuid4().hex[:8]}", uuid.uuid4().hex[:6]
    # Every workflow (their children start on this queue) and, of the activities, only the local ones that a first
    # workflow task runs (the disruption budget reads its predecessor's settings, a rollout its cluster's validation
    # default: the emulator has none): nothing else runs.
    from activities.entities import EntityActivities
    from activities.kube.activities import KubeActivities
    from activities.kube.connector import ClusterConnector

    connector = ClusterConnector([str(kubeconfig_path)])
    local = [*activity_methods(EntityActivities()), KubeActivities(connector).read_validation_default]
    registration = registry.Registration(workflows=list(WORKFLOWS), activities=local)
    async with registry.new_worker(client, registration, queue):
        handles = {name: await client.start_workflow(name, data, id=f"typo-update-{name}-{tag}", task_queue=queue)
                   for name, data in RUNNING.items()}  # fmt: skip
        try:
            for name, handlers in sorted(updates.items()):
                handle = handles[name]
                for update, defn in sorted(handlers.items()):
                    [arg] = defn.arg_types
                    field = misspelt(next(iter(arg.model_fields)))
                    with pytest.raises(WorkflowUpdateFailedError) as rejected:
                        await asyncio.wait_for(handle.execute_update(update, {field: "x"}), 30)
                    cause = rejected.value.cause
                    assert cause.type == "ValidationError", (name, update, cause)
                    assert re.search(rf"^{re.escape(field)}\n  Extra inputs are not permitted", cause.message, re.M), (
                        name, update, cause.message)  # fmt: skip
                assert (await handle.describe()).status.name == "RUNNING", name
                events = {EventType.Name(e.event_type) for e in (await handle.fetch_history()).events}
                assert not events & {"EVENT_TYPE_WORKFLOW_TASK_FAILED", "EVENT_TYPE_WORKFLOW_EXECUTION_UPDATE_ACCEPTED"}
            # The issue's `reasn` was refused above; spelt right, the same control is taken.
            maintenance = handles["NodeMaintenance"]
            await maintenance.execute_update(NodeMaintenance.abort, AbortRequest(reason="change window closed"))
            events = [EventType.Name(e.event_type) for e in (await maintenance.fetch_history()).events]
            assert events.count("EVENT_TYPE_WORKFLOW_EXECUTION_UPDATE_ACCEPTED") == 1
        finally:
            for handle in handles.values():
                await handle.terminate("test over")
    await connector.close()


# ================================================================= URLs


GOOD_URLS = ["https://10.0.0.5", "http://127.0.0.1:9000/hooks/ops", "https://bmc-01.example.com:8443",
             "http://[fd00::5]:8000/redfish", "https://netbox.example.com/api/?brief=1", "http://ufm"]  # fmt: skip
BAD_URLS = {
    "http://127.0.0.1:<port of gpu-node-01's BMC: see `millwright lab status`>": "placeholder",
    "http://127.0.0.1:0": "port '0'",
    "http://127.0.0.1:65536": "port '65536'",
    "http://127.0.0.1:80a": "port '80a'",
    "http://bmc:": "port after ':' is missing",
    "ftp://bmc": "scheme must be http or https",
    "bmc.example.com": "not a URL",
    "http://": "no host",
    "http://admin:hunter2@bmc": "credentials do not belong in the URL",
    "http://300.1.1.1": "not an IPv4 address",
    "http://-bmc-": "not a DNS name",
    "http://[fd00::5": "Invalid IPv6 URL",
    "http://bmc/#top": "#fragment",
    " http://bmc": "blanks",
}


def test_a_base_url_is_an_http_url_with_a_host_and_a_real_port():
    from activities.redfish import BmcRef

    for url in GOOD_URLS:
        assert BmcRef(url=url).url == url
    for url, problem in BAD_URLS.items():
        with pytest.raises(pydantic.ValidationError) as refused:
            BmcRef(url=url)
        [error] = refused.value.errors()
        assert error["loc"] == ("url",) and problem in error["msg"], (url, error)
        assert "hunter2" not in error["msg"], "the refusal must not echo credentials"


def test_the_shipped_burn_in_example_is_refused_naming_bmc_url():
    with pytest.raises(InputError) as refused:
        parse_input("ServerBurnIn", (EXAMPLES / "server-burn-in.json").read_text())
    [line] = refused.value.errors
    assert line.startswith("server.bmc.url: ") and "placeholder" in line, line


def test_the_burn_in_input_lab_up_writes_is_valid(tmp_path):
    from lab.runner import Lab

    lab = Lab(state_dir=tmp_path, fleet=tmp_path / "fleet.json", port=0, ui_port=0, task_queue="q", timeout=1)
    path = lab.write_examples({"specs": [{"name": "gpu-node-01"}], "servers": {"gpu-node-01": "http://127.0.0.1:41017"}},
                              None)["server-burn-in"]  # fmt: skip
    inp = parse_input("ServerBurnIn", path.read_text())
    assert inp.server.bmc.url == "http://127.0.0.1:41017" and inp.server.name == "gpu-node-01"


def test_hosts_and_worker_urls_are_validated():
    from activities.ironic.steps import NetworkPartner
    from worker.config import WorkerSettings

    assert NetworkPartner(role="writer", partner="10.0.0.7").partner == "10.0.0.7"
    with pytest.raises(pydantic.ValidationError, match="partner\n  host '<the other node>' is a placeholder"):
        NetworkPartner(role="writer", partner="<the other node>")
    with pytest.raises(InputError) as refused:
        parse_input("CreateCluster", {"name": "a", "control_plane_endpoint": "https://x:6443"})
    assert refused.value.errors == [
        "control_plane_endpoint: host 'https://x:6443' is not a host name or IP address (no scheme, port or path)"
    ]
    with pytest.raises(pydantic.ValidationError, match="netbox_url\n  port '80a'"):
        WorkerSettings(netbox_url="http://netbox:80a")
