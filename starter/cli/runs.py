"""`millwright start`, `watch` and `schema`: start a workflow from JSON, follow a run, describe every input; and
`millwright rack remediate DOMAIN`, which starts (or plans) a whole NVLink domain's RackRemediation."""

from __future__ import annotations

import asyncio
import json
from datetime import timedelta
from pathlib import Path
from typing import Annotated, Any

import typer
import yaml
from pydantic import BaseModel

from starter.cli.common import (
    AddressOpt,
    DomainArg,
    KubeconfigOpt,
    NamespaceOpt,
    OutputOpt,
    StateDir,
    UiOpt,
    app,
    connect,
    emit,
    err,
    failure_text,
    jsonable,
    one_line,
    out,
    rack_app,
    read_input,
    spec_or_exit,
    ui_base,
)
from starter.cli.controls import ByOpt, NeedCluster, ReasonOpt

# ---------------------------------------------------------------- start


@app.command()
def start(
    workflow: Annotated[str, typer.Argument(help="Workflow type, e.g. NodeMaintenance.")],
    input: Annotated[str, typer.Option("--input", "-i", help="JSON input file, or - for stdin.")],
    task_queue: Annotated[str, typer.Option("--task-queue", "-q", envvar="MILLWRIGHT_TASK_QUEUE")] = "millwright",
    id: Annotated[str | None, typer.Option("--id", help="Workflow ID (default: derived from the input).")] = None,
    watch_: Annotated[bool, typer.Option("--watch", "-w", help="Then watch it until it closes.")] = False,
    address: AddressOpt = None,
    namespace: NamespaceOpt = None,
    ui: UiOpt = None,
    state_dir: StateDir = Path(".millwright"),
) -> None:
    """Validate JSON input against the workflow's model, then start it (or attach to the running one)."""
    from starter.client import InputError, parse_input, ui_link
    from starter.client import start as start_workflow

    spec = spec_or_exit(workflow)
    try:
        inp = parse_input(spec, read_input(input))
    except InputError as e:
        err.print(f"[red]error:[/] invalid input for {spec.name}; nothing was started:")
        for line in e.errors:
            err.print(f"  {line}")
        raise typer.Exit(2) from None

    async def run() -> int:
        client = await connect(address, namespace, state_dir)
        started = await start_workflow(client, inp, task_queue=task_queue, id=id, workflow=spec.name)
        if started.already_running:
            out.print(
                f"{spec.name} is already running with this ID: attached to the existing run (nothing new started)"
            )
        else:
            out.print(f"started {spec.name} on task queue {task_queue}")
        out.print(f"  workflow id: {started.workflow_id}")
        out.print(f"  run id:      {started.run_id}")
        out.print(
            f"  ui:          {ui_link(ui_base(ui, state_dir), client.namespace, started.workflow_id, started.run_id)}"
        )
        if not watch_:
            out.print(f"  watch:       millwright watch {_shell_quote(started.workflow_id)}")
            return 0
        return await _watch(client, started.workflow_id, None, 1.0)

    raise typer.Exit(asyncio.run(run()))


def _shell_quote(s: str) -> str:
    import shlex

    return shlex.quote(s)


# ---------------------------------------------------------------- rack remediate


@rack_app.command("remediate")
def rack_remediate(
    domain: DomainArg,
    cluster: NeedCluster,
    reason: ReasonOpt,
    by: ByOpt,
    dry_run: Annotated[
        bool, typer.Option("--dry-run", help="Start nothing: print what the run would lease, cordon and power-cycle.")
    ] = False,
    require_approval: Annotated[
        bool, typer.Option("--require-approval", help="The power cycle waits for `rack approve` (or `reject`).")
    ] = False,
    settings: Annotated[
        str | None,
        typer.Option("--settings", help="JSON or YAML file (- for stdin): more of RackRemediation's input fields."),
    ] = None,
    task_queue: Annotated[str, typer.Option("--task-queue", "-q", envvar="MILLWRIGHT_TASK_QUEUE")] = "millwright",
    kubeconfig: KubeconfigOpt = None,
    output: OutputOpt = "table",
    address: AddressOpt = None,
    namespace: NamespaceOpt = None,
    ui: UiOpt = None,
    state_dir: StateDir = Path(".millwright"),
) -> None:
    """Remediate the domain whole: start its RackRemediation, named by its rack (one run per domain, whoever asks)."""
    from starter.client import InputError, ui_link
    from starter.controls import ControlError
    from starter.racks import AlreadyRunning, open_cluster, rack_input, rack_plan
    from starter.racks import rack_remediate as remediate

    try:
        inp = rack_input(cluster, domain, reason=reason, by=by, settings=_settings(settings),
                         require_approval=require_approval)  # fmt: skip
    except InputError as e:
        err.print(f"error: invalid input for {e.workflow}; nothing was started:", style="red", markup=False)
        for line in e.errors:
            err.print(f"  {line}", markup=False)
        raise typer.Exit(2) from None

    async def run() -> int:
        client = await connect(address, namespace, state_dir, identity=by)
        try:
            async with open_cluster(cluster, kubeconfig) as (_, connector):
                plan = await rack_plan(client, connector, inp, task_queue=task_queue)
            if dry_run:
                emit(plan, output, lambda wide: plan_lines(plan))
                err.print(f"dry run: {plan.workflow_id} was not started", markup=False)
                return 1 if plan.held_by else 0
            started = await remediate(client, plan)
        except AlreadyRunning as e:
            err.print(f"error: {e}", style="red", markup=False)
            out.print(f"  workflow id: {e.workflow_id}", markup=False)
            return 1
        except ControlError as e:
            err.print(f"error: {e}", style="red", markup=False)
            return 1
        link = ui_link(ui_base(ui, state_dir), client.namespace, started.workflow_id, started.run_id)
        answer = {"workflow_id": started.workflow_id, "run_id": started.run_id, "task_queue": task_queue, "ui": link,
                  "nodes": plan.nodes}  # fmt: skip
        emit(answer, output, lambda wide: [
            f"started RackRemediation on task queue {task_queue}: {len(plan.nodes)} nodes of rack {plan.rack}",
            f"  workflow id: {started.workflow_id}", f"  run id:      {started.run_id}", f"  ui:          {link}",
            f"  status:      millwright rack status {_shell_quote(plan.rack)} --cluster {_shell_quote(cluster)}",
        ])  # fmt: skip
        return 0

    raise typer.Exit(asyncio.run(run()))


def _settings(source: str | None) -> dict[str, Any]:
    if source is None:
        return {}
    try:
        data = yaml.safe_load(read_input(source))
    except yaml.YAMLError as e:
        err.print(f"error: --settings {source}: neither JSON nor YAML: {e}", style="red", markup=False)
        raise typer.Exit(2) from None
    if not isinstance(data, dict):
        err.print(f"error: --settings {source}: expected a mapping of RackRemediation's input fields", style="red",
                  markup=False)  # fmt: skip
        raise typer.Exit(2)
    return data


def plan_lines(p: Any) -> list[str]:
    lines = [f"would start RackRemediation {p.workflow_id} on task queue {p.task_queue}: rack {p.rack}, NVLink "
             f"domain {p.domain or '-'}, {len(p.nodes)} nodes"]  # fmt: skip
    if p.held_by:
        lines.append(f"already held: {p.held_by} runs for this domain; a start would start nothing")
    if p.no_bmc:
        lines.append(f"refused: no BMC known for {', '.join(p.no_bmc)} (give `bmcs` in --settings, or `netbox: "
                     "true`): the run would end touching nothing")  # fmt: skip
    lines.append(f"told to stand down: {', '.join(p.stand_down) or 'none (no NodeRemediation runs on its nodes)'}")
    lines += [f"lease: {p.lease}", f"cordon: {', '.join(p.cordon) or 'none'}"]
    lines += [f"  {node}: cordoned by {who}: drained and powered with the rack, its cordon left to them"
              for node, who in sorted(p.not_ours.items())]  # fmt: skip
    lines.append(f"drain: all {len(p.nodes)} nodes at once (a gang across the domain is evicted together, once)")
    lines += [f"approval: {p.approval}"] if p.approval else []
    lines += [f"power: {step}" for step in p.power]
    lines.append("  (in tray order, which the run reads from each tray's BMC; by name here)")
    checks = "each node's own check" + (" and the domain-wide check" if p.input.domain_check else "")
    lines.append(f"then: every node Ready with a new boot ID and its clique label back, {checks}, and every node "
                 "that passed back in service together")  # fmt: skip
    return lines


# ---------------------------------------------------------------- watch


@app.command()
def watch(
    workflow_id: Annotated[str, typer.Argument(metavar="ID", help="Workflow ID.")],
    run_id: Annotated[str | None, typer.Option("--run-id", help="A specific run (default: the latest).")] = None,
    interval: Annotated[float, typer.Option("--interval", help="Seconds between progress polls.")] = 1.0,
    address: AddressOpt = None,
    namespace: NamespaceOpt = None,
    state_dir: StateDir = Path(".millwright"),
) -> None:
    """Show live progress until the run closes; print its result (exit 0) or failure (exit 1)."""

    async def run() -> int:
        client = await connect(address, namespace, state_dir)
        return await _watch(client, workflow_id, run_id, interval)

    raise typer.Exit(asyncio.run(run()))


async def _watch(client, workflow_id: str, run_id: str | None, interval: float) -> int:
    from rich.progress import BarColumn, MofNCompleteColumn, SpinnerColumn, TextColumn, TimeElapsedColumn
    from rich.progress import Progress as Bar
    from temporalio.client import WorkflowExecutionStatus, WorkflowFailureError
    from temporalio.service import RPCError, RPCStatusCode

    from starter.client import workflow_specs
    from workflows.common.base import Progress

    handle = client.get_workflow_handle(workflow_id, run_id=run_id)
    try:
        desc = await handle.describe()
    except RPCError as e:
        if e.status == RPCStatusCode.NOT_FOUND:
            err.print(f"[red]error:[/] no workflow with ID {workflow_id!r} in namespace {client.namespace}")
            return 1
        raise
    spec = workflow_specs().get(desc.workflow_type)
    said: set[str] = set()  # retry lines already printed: each once, when it first appears
    last = [""]  # the progress line last printed where no live bar shows it

    def say(bar: Bar, line: str) -> None:
        if line not in said:
            said.add(line)
            bar.console.print(line, markup=False, highlight=False)

    def show(bar: Bar, task, p: Progress) -> None:
        bar.update(task, total=p.total or None, completed=p.done, phase=p.phase, details=one_line(p.details))
        line = f"{p.phase}" + (f" {p.done}/{p.total}" if p.total else "") + f" {one_line(p.details)}".rstrip()
        if not err.is_terminal and line != last[0]:  # piped or logged: each change of the progress is a line
            last[0] = line
            bar.console.print(line, markup=False, highlight=False)
        for w in p.waiting:  # a call that keeps failing: the endpoint, the error, the attempts, since when
            say(bar, one_line(w.line(), limit=1000))

    with Bar(
        SpinnerColumn(),
        TextColumn("[bold]{task.fields[phase]}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        TextColumn("{task.fields[details]}", markup=False),
        console=err,
    ) as bar:
        task = bar.add_task(workflow_id, total=None, phase="…", details="")
        while True:
            desc = await handle.describe()
            if desc.status == WorkflowExecutionStatus.CONTINUED_AS_NEW and run_id is None:
                handle = client.get_workflow_handle(workflow_id)
                continue
            if desc.status != WorkflowExecutionStatus.RUNNING:
                bar.update(task, phase=desc.status.name.lower() if desc.status else "closed")
                break
            for line in _retrying_activities(desc):
                say(bar, line)
            try:
                p = await handle.query("progress", result_type=Progress, rpc_timeout=timedelta(seconds=5))
                show(bar, task, p)
            except Exception as e:  # no worker polling yet, or the query failed
                first = str(e).splitlines()[0][:80] if str(e) else type(e).__name__
                bar.update(task, details=f"(no progress answer: {first})")
                if not err.is_terminal:
                    say(bar, f"(no progress answer: {first})")
            await asyncio.sleep(interval)

    status = desc.status.name if desc.status else "UNKNOWN"
    result_type = spec.output_model if spec else None
    result_handle = client.get_workflow_handle(
        workflow_id, run_id=handle.run_id or desc.run_id, result_type=result_type
    )
    try:
        result = await result_handle.result(follow_runs=run_id is None)
    except WorkflowFailureError as e:
        err.print(f"[red]{desc.workflow_type} {workflow_id}: {status}[/]")
        err.print(failure_text(e))
        return 1
    out.print(json.dumps(jsonable(result), indent=2), markup=False)
    err.print(f"[green]{desc.workflow_type} {workflow_id}: COMPLETED[/]")
    return 0


def _retrying_activities(desc) -> list[str]:
    """The run's pending activities that failed at least once: each attempt's error as the server last saw it."""
    lines = []
    for a in desc.raw_description.pending_activities:
        if a.attempt > 1 and a.last_failure.message:
            lines.append(f"retrying {a.activity_type.name} (attempt {a.attempt}): {a.last_failure.message[:500]}")
    return lines


# ---------------------------------------------------------------- schema


@app.command()
def schema(
    out_dir: Annotated[
        Path | None, typer.Option("--out", help="Write <Workflow>.input/output.schema.json + index.json here.")
    ] = None,
) -> None:
    """JSON Schema of every workflow's input and output, for callers in other languages."""
    from starter.client import DEFAULT_TASK_QUEUE, workflow_specs

    specs = workflow_specs()
    index: dict[str, Any] = {"task_queue": DEFAULT_TASK_QUEUE, "encoding": "json/plain", "workflows": []}
    documents: dict[str, Any] = {}
    for name, spec in sorted(specs.items()):
        entry = {
            "name": name,
            "input": f"{name}.input.schema.json",
            "output": f"{name}.output.schema.json",
            "description": _first_line(spec.cls.__doc__ or spec.input_model.__doc__),
        }
        index["workflows"].append(entry)
        documents[entry["input"]] = _schema_doc(spec.input_model, f"{name} input")
        documents[entry["output"]] = _schema_doc(spec.output_model, f"{name} output")
    if out_dir is None:
        out.print(json.dumps({"index": index, "schemas": documents}, indent=2), markup=False)
        raise typer.Exit(0)
    out_dir.mkdir(parents=True, exist_ok=True)
    for filename, doc in documents.items():
        (out_dir / filename).write_text(json.dumps(doc, indent=2) + "\n")
    (out_dir / "index.json").write_text(json.dumps(index, indent=2) + "\n")
    out.print(f"wrote {len(documents)} schemas and index.json to {out_dir}")
    raise typer.Exit(0)


def _first_line(doc: str | None) -> str:
    lines = (doc or "").strip().splitlines()
    return lines[0].strip() if lines else ""


def _schema_doc(model: type[BaseModel], title: str) -> dict[str, Any]:
    doc = {"$schema": "https://json-schema.org/draft/2020-12/schema"}
    doc.update(model.model_json_schema())
    doc.setdefault("title", title)
    return doc
