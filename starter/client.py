"""The client library other Python services import to start Millwright workflows.

from starter.client import connect, parse_input, start

client = await connect()                       # TEMPORAL_* env / profile + pydantic converter
inp = parse_input("NodeMaintenance", {"cluster": "lab", "node": "gpu-node-03", ...})
started = await start(client, inp)             # ID from the input: double submissions collapse
result = await started.handle.result()
"""

from __future__ import annotations

import difflib
import json
import typing
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

import pydantic
from temporalio.client import Client, WorkflowHandle
from temporalio.common import TypedSearchAttributes
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.envconfig import ClientConfig
from temporalio.exceptions import WorkflowAlreadyStartedError
from temporalio.workflow import _Definition

from workflows.common.base import WorkflowInput

DEFAULT_TASK_QUEUE = "millwright"
DEFAULT_ADDRESS = "localhost:7233"
DEFAULT_NAMESPACE = "default"
DEFAULT_UI = "http://127.0.0.1:8233"


class UnknownWorkflowError(LookupError):
    def __init__(self, name: str, known: list[str]) -> None:
        self.name, self.known = name, known
        super().__init__(f"unknown workflow {name!r}; known workflows: {', '.join(known) or '(none)'}")


class InputError(ValueError):
    """Input that does not fit a workflow's model; ``errors`` holds one ``field.path: message`` per problem."""

    def __init__(self, workflow: str, errors: list[str]) -> None:
        self.workflow, self.errors = workflow, errors
        super().__init__(f"invalid input for {workflow}:\n" + "\n".join(f"  {e}" for e in errors))


@dataclass(frozen=True)
class WorkflowSpec:
    name: str  # the workflow type name, as the UI and other SDKs use it
    cls: type
    input_model: type[WorkflowInput]
    output_model: type[pydantic.BaseModel]


@dataclass(frozen=True)
class Started:
    handle: WorkflowHandle[Any, Any]
    workflow_id: str
    run_id: str
    already_running: bool  # True: a run with this ID was already running and we attached to it


def _spec(cls: type) -> WorkflowSpec:
    defn = _Definition.must_from_class(cls)
    arg_types, ret_type = defn.arg_types, defn.ret_type
    if not arg_types or ret_type is None:
        hints = typing.get_type_hints(defn.run_fn)
        ret_type = hints.pop("return", None)
        arg_types = list(hints.values())
    if len(arg_types) != 1 or not (isinstance(arg_types[0], type) and issubclass(arg_types[0], WorkflowInput)):
        raise TypeError(f"workflow {cls.__name__} must take exactly one WorkflowInput model")
    if not (isinstance(ret_type, type) and issubclass(ret_type, pydantic.BaseModel)):
        raise TypeError(f"workflow {cls.__name__} must return a pydantic model")
    return WorkflowSpec(defn.name or cls.__name__, cls, arg_types[0], ret_type)


def workflow_specs() -> dict[str, WorkflowSpec]:
    from workflows.catalog import STARTABLE

    specs = [_spec(cls) for cls in STARTABLE]
    return {s.name: s for s in specs}


def workflow_by_name(name: str) -> WorkflowSpec:
    specs = workflow_specs()
    try:
        return specs[name]
    except KeyError:
        raise UnknownWorkflowError(name, sorted(specs)) from None


def format_validation_error(err: pydantic.ValidationError, model: type[pydantic.BaseModel] | None = None) -> list[str]:
    """pydantic errors as ``field.path: message`` lines (``(input)`` for the whole document).

    Unknown fields come first: a misspelt ``reasn`` is the cause of the ``reason: Field required`` after it. With
    the ``model``, each names the closest field the object at that path takes."""
    schema = model.model_json_schema() if model is not None else {}
    lines = []
    for e in sorted(err.errors(include_url=False), key=lambda e: e["type"] != "extra_forbidden"):
        path = ".".join(str(p) for p in e["loc"]) or "(input)"
        message = e["msg"].removeprefix("Value error, ")
        if e["type"] == "extra_forbidden" and e["loc"]:
            close = difflib.get_close_matches(str(e["loc"][-1]), _fields_at(schema, e["loc"][:-1]), n=1)
            message += f"; did you mean {close[0]!r}?" if close else ""
        lines.append(f"{path}: {message}")
    return lines


def _fields_at(schema: dict[str, Any], loc: tuple[int | str, ...]) -> list[str]:
    """The property names of the object the JSON Schema allows at ``loc`` ([] where the path cannot be followed)."""
    defs = schema.get("$defs", {})

    def branches(node: dict[str, Any]) -> list[dict[str, Any]]:  # the node itself, $ref resolved, and its anyOf arms
        node = defs.get(node["$ref"].rsplit("/", 1)[-1], {}) if "$ref" in node else node
        return [node] + [b for arm in node.get("anyOf", []) for b in branches(arm)]

    nodes = [schema]
    for part in loc:
        nodes = [
            child
            for node in nodes
            for branch in branches(node)
            for child in [
                branch.get("items")
                if isinstance(part, int)
                else branch.get("properties", {}).get(part, branch.get("additionalProperties"))
            ]
            if isinstance(child, dict)
        ]
    return [name for node in nodes for branch in branches(node) for name in branch.get("properties", {})]


def parse_input(name: str | WorkflowSpec, data: dict[str, Any] | str | bytes) -> WorkflowInput:
    """Validate JSON (text or already-parsed dict) against a workflow's input model."""
    spec = name if isinstance(name, WorkflowSpec) else workflow_by_name(name)
    if isinstance(data, (str, bytes)):
        try:
            data = json.loads(data)
        except json.JSONDecodeError as err:
            raise InputError(spec.name, [f"(input): not valid JSON: {err}"]) from err
    if not isinstance(data, dict):
        raise InputError(spec.name, [f"(input): expected a JSON object, got {type(data).__name__}"])
    try:
        return spec.input_model.model_validate(data)
    except pydantic.ValidationError as err:
        raise InputError(spec.name, format_validation_error(err, spec.input_model)) from err


def connect_config(
    *, profile: str | None = None, default_address: str | None = None, **overrides: Any
) -> dict[str, Any]:
    """Client.connect kwargs: TEMPORAL_* env vars / TOML profile, then ``overrides``.

    ``default_address`` is used only when neither the environment nor the profile names
    an address (else ``localhost:7233``).
    """
    config: dict[str, Any] = dict(ClientConfig.load_client_connect_config(profile=profile))
    config.setdefault("target_host", default_address or DEFAULT_ADDRESS)
    config.setdefault("namespace", DEFAULT_NAMESPACE)
    config.update({k: v for k, v in overrides.items() if v is not None})
    config["data_converter"] = pydantic_data_converter
    return config


async def connect(**overrides: Any) -> Client:
    """Connect like the worker does (env/profile config, pydantic data converter).

    ``overrides`` are Client.connect arguments (``target_host``, ``namespace``, ``api_key``,
    ``tls``, ...) plus ``profile`` to pick a TOML profile.
    """
    return await Client.connect(**connect_config(**overrides))


def _workflow_for_input(inp: WorkflowInput) -> WorkflowSpec:
    for spec in workflow_specs().values():
        if type(inp) is spec.input_model:
            return spec
    raise TypeError(f"no workflow takes {type(inp).__name__}")


async def start(
    client: Client,
    inp: WorkflowInput,
    *,
    task_queue: str = DEFAULT_TASK_QUEUE,
    id: str | None = None,
    workflow: str | None = None,
) -> Started:
    """Start the workflow that takes ``inp``; if a run with its ID is running, attach to it.

    The ID is ``inp.workflow_id()`` unless given, so submitting the same request twice
    yields one run (``Started.already_running`` tells which happened).
    """
    spec = workflow_by_name(workflow) if workflow else _workflow_for_input(inp)
    wf_id = id or inp.workflow_id()
    try:
        handle = await client.start_workflow(
            spec.name,
            inp,
            id=wf_id,
            task_queue=task_queue,
            search_attributes=search_attributes_of(inp),
            result_type=spec.output_model,
        )
        run_id = handle.result_run_id or handle.run_id or ""
        return Started(handle, wf_id, run_id, already_running=False)
    except WorkflowAlreadyStartedError as err:
        handle = client.get_workflow_handle(wf_id, run_id=err.run_id, result_type=spec.output_model)
        return Started(handle, wf_id, err.run_id or "", already_running=True)


def search_attributes_of(inp: WorkflowInput) -> TypedSearchAttributes:
    """The input's search attributes, as set at start."""
    return TypedSearchAttributes(inp.search_attributes())


def ui_link(ui_base: str, namespace: str, workflow_id: str, run_id: str | None = None) -> str:
    base = ui_base.rstrip("/")
    url = f"{base}/namespaces/{quote(namespace, safe='')}/workflows/{quote(workflow_id, safe='')}"
    return f"{url}/{run_id}/history" if run_id else url
