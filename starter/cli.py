"""``millwright``: start, watch and describe Millwright workflows; run the emulated lab.

Exit codes: 0 success; 1 failure (run failed, connection error, lab problem);
2 bad usage or input (unknown workflow, input that does not fit the model).

Longer than 600 lines because it is the one argparse front of every command (start, watch, schema, rollout,
schedules, inventory, lab): each command's parser sits beside the few lines that run it; what they call lives in
starter/client.py, starter/schedules/ and lab/runner.py.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
from datetime import timedelta
from pathlib import Path
from typing import Annotated, Any, Optional

import typer
from rich.console import Console

app = typer.Typer(
    name="millwright",
    help="Start and watch Millwright workflows (GPU AI-factory operations on Temporal).",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
lab_app = typer.Typer(
    help="The emulated lab: Temporal dev server + Kubernetes emulator + worker.", no_args_is_help=True
)
app.add_typer(lab_app, name="lab")
inventory_app = typer.Typer(
    help="Inventory in NetBox (the worker holds the NetBox URL and token).", no_args_is_help=True
)
app.add_typer(inventory_app, name="inventory")
rollout_app = typer.Typer(help="Progressive host-OS rollouts (NodeWright-style).", no_args_is_help=True)
app.add_typer(rollout_app, name="rollout")
schedules_app = typer.Typer(
    help="Temporal Schedules as code: apply a YAML file of schedules, list them.", no_args_is_help=True
)
app.add_typer(schedules_app, name="schedules")

out = Console(highlight=False, soft_wrap=True)
err = Console(stderr=True, highlight=False, soft_wrap=True)

DEFAULT_UI = "http://127.0.0.1:8233"

StateDir = Annotated[
    Path,
    typer.Option("--state-dir", envvar="MILLWRIGHT_STATE_DIR", help="Lab state directory (lab.json, logs, databases)."),
]
AddressOpt = Annotated[
    Optional[str],
    typer.Option(
        "--address",
        help="Temporal frontend host:port. Default: TEMPORAL_ADDRESS / TEMPORAL_PROFILE, else the running lab, else localhost:7233.",
    ),
]
NamespaceOpt = Annotated[
    Optional[str], typer.Option("--namespace", help="Temporal namespace (default: TEMPORAL_NAMESPACE or 'default').")
]
UiOpt = Annotated[
    Optional[str],
    typer.Option(
        "--ui",
        envvar="MILLWRIGHT_UI_URL",
        help="Temporal Web UI base URL for links (default: the running lab's, else http://127.0.0.1:8233).",
    ),
]


# ---------------------------------------------------------------- helpers


def running_lab(state_dir: Path) -> dict[str, Any] | None:
    """The running lab's addresses, so `start` and `watch` find it without flags."""
    from lab.runner import running_lab as lab_info

    return lab_info(state_dir)


def _ui_base(ui: str | None, state_dir: Path) -> str:
    if ui:
        return ui
    lab = running_lab(state_dir)
    if lab and lab.get("ui"):
        return str(lab["ui"])
    return DEFAULT_UI


def _connect_kwargs(address: str | None, namespace: str | None, state_dir: Path) -> dict[str, Any]:
    from starter.client import connect_config

    lab = running_lab(state_dir)
    lab_address = ((lab or {}).get("temporal") or {}).get("address")
    return connect_config(default_address=lab_address, target_host=address, namespace=namespace)


async def _connect(address: str | None, namespace: str | None, state_dir: Path):
    from temporalio.client import Client

    kwargs = _connect_kwargs(address, namespace, state_dir)
    try:
        return await Client.connect(**kwargs)
    except Exception as e:
        err.print(
            f"[red]error:[/] cannot connect to Temporal at {kwargs['target_host']} (namespace {kwargs['namespace']}): {e}"
        )
        raise typer.Exit(1) from None


def _read_input(source: str) -> str:
    if source == "-":
        return sys.stdin.read()
    try:
        return Path(source).read_text()
    except OSError as e:
        err.print(f"[red]error:[/] cannot read input {source}: {e.strerror or e}")
        raise typer.Exit(2) from None


def _spec_or_exit(name: str):
    from starter.client import UnknownWorkflowError, workflow_by_name

    try:
        return workflow_by_name(name)
    except UnknownWorkflowError as e:
        err.print(f"[red]error:[/] unknown workflow {name!r}. Known workflows: {', '.join(e.known) or '(none)'}")
        raise typer.Exit(2) from None


# ---------------------------------------------------------------- start


@app.command()
def start(
    workflow: Annotated[str, typer.Argument(help="Workflow type, e.g. NodeMaintenance.")],
    input: Annotated[str, typer.Option("--input", "-i", help="JSON input file, or - for stdin.")],
    task_queue: Annotated[str, typer.Option("--task-queue", "-q", envvar="MILLWRIGHT_TASK_QUEUE")] = "millwright",
    id: Annotated[Optional[str], typer.Option("--id", help="Workflow ID (default: derived from the input).")] = None,
    watch_: Annotated[bool, typer.Option("--watch", "-w", help="Then watch it until it closes.")] = False,
    address: AddressOpt = None,
    namespace: NamespaceOpt = None,
    ui: UiOpt = None,
    state_dir: StateDir = Path(".millwright"),
) -> None:
    """Validate JSON input against the workflow's model, then start it (or attach to the running one)."""
    from starter.client import InputError, parse_input, ui_link
    from starter.client import start as start_workflow

    spec = _spec_or_exit(workflow)
    try:
        inp = parse_input(spec, _read_input(input))
    except InputError as e:
        err.print(f"[red]error:[/] invalid input for {spec.name}; nothing was started:")
        for line in e.errors:
            err.print(f"  {line}")
        raise typer.Exit(2) from None

    async def run() -> int:
        client = await _connect(address, namespace, state_dir)
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
            f"  ui:          {ui_link(_ui_base(ui, state_dir), client.namespace, started.workflow_id, started.run_id)}"
        )
        if not watch_:
            out.print(f"  watch:       millwright watch {_shell_quote(started.workflow_id)}")
            return 0
        return await _watch(client, started.workflow_id, None, 1.0)

    raise typer.Exit(asyncio.run(run()))


def _shell_quote(s: str) -> str:
    import shlex

    return shlex.quote(s)


# ---------------------------------------------------------------- watch


@app.command()
def watch(
    workflow_id: Annotated[str, typer.Argument(metavar="ID", help="Workflow ID.")],
    run_id: Annotated[Optional[str], typer.Option("--run-id", help="A specific run (default: the latest).")] = None,
    interval: Annotated[float, typer.Option("--interval", help="Seconds between progress polls.")] = 1.0,
    address: AddressOpt = None,
    namespace: NamespaceOpt = None,
    state_dir: StateDir = Path(".millwright"),
) -> None:
    """Show live progress until the run closes; print its result (exit 0) or failure (exit 1)."""

    async def run() -> int:
        client = await _connect(address, namespace, state_dir)
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
        bar.update(task, total=p.total or None, completed=p.done, phase=p.phase, details=_one_line(p.details))
        line = f"{p.phase}" + (f" {p.done}/{p.total}" if p.total else "") + f" {_one_line(p.details)}".rstrip()
        if not err.is_terminal and line != last[0]:  # piped or logged: each change of the progress is a line
            last[0] = line
            bar.console.print(line, markup=False, highlight=False)
        for w in p.waiting:  # a call that keeps failing: the endpoint, the error, the attempts, since when
            say(bar, _one_line(w.line(), limit=1000))

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
        err.print(_failure_text(e))
        return 1
    out.print(json.dumps(_jsonable(result), indent=2), markup=False)
    err.print(f"[green]{desc.workflow_type} {workflow_id}: COMPLETED[/]")
    return 0


def _retrying_activities(desc) -> list[str]:
    """The run's pending activities that failed at least once: each attempt's error as the server last saw it."""
    lines = []
    for a in desc.raw_description.pending_activities:
        if a.attempt > 1 and a.last_failure.message:
            lines.append(f"retrying {a.activity_type.name} (attempt {a.attempt}): {a.last_failure.message[:500]}")
    return lines


def _one_line(markdown: str, limit: int = 120) -> str:
    """Progress details are markdown for the UI; the terminal bar gets one plain line."""
    text = " · ".join(line.strip() for line in markdown.replace("**", "").replace("`", "").splitlines() if line.strip())
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _failure_text(e: BaseException) -> str:
    lines = []
    cur: BaseException | None = e.cause if getattr(e, "cause", None) else e
    while cur is not None:
        msg = getattr(cur, "message", None) or str(cur)
        kind = getattr(cur, "type", None) or type(cur).__name__
        lines.append(f"{kind}: {msg}")
        cur = getattr(cur, "cause", None) or cur.__cause__
    return "\n".join(lines) if lines else str(e)


def _jsonable(value: Any) -> Any:
    from pydantic import BaseModel

    if isinstance(value, BaseModel):
        return value.model_dump(mode="json")
    return value


# ---------------------------------------------------------------- schema


@app.command()
def schema(
    out_dir: Annotated[
        Optional[Path], typer.Option("--out", help="Write <Workflow>.input/output.schema.json + index.json here.")
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


def _schema_doc(model: type, title: str) -> dict[str, Any]:
    doc = {"$schema": "https://json-schema.org/draft/2020-12/schema"}
    doc.update(model.model_json_schema())
    doc.setdefault("title", title)
    return doc


# ---------------------------------------------------------------- lab


@lab_app.command("up")
def lab_up(
    state_dir: StateDir = Path(".millwright"),
    fleet: Annotated[
        Optional[Path], typer.Option("--fleet", help="Fleet file to seed a fresh lab (default lab/fleets/demo.json).")
    ] = None,
    port: Annotated[int, typer.Option("--port", help="Temporal gRPC port (0 = any free port).")] = 7233,
    ui_port: Annotated[int, typer.Option("--ui-port", help="Temporal Web UI port (0 = any free port).")] = 8233,
    task_queue: Annotated[str, typer.Option("--task-queue")] = "millwright",
    timeout: Annotated[float, typer.Option("--timeout", help="Seconds to wait for everything to come up.")] = 60.0,
    without: Annotated[
        Optional[list[str]],
        typer.Option(
            "--without",
            metavar="SERVICE[,SERVICE]",
            envvar="MILLWRIGHT_LAB_WITHOUT",
            help="Leave services out: netbox, ufm, webhook, bmcs (with their host agents).",
        ),
    ] = None,
    bmc_http: Annotated[
        bool, typer.Option("--bmc-http", help="The BMCs answer plain HTTP instead of HTTPS with the lab CA.")
    ] = False,
) -> None:
    """Start the lab on 127.0.0.1 and block until Ctrl-C or `millwright lab down`."""
    from lab import runner

    raise typer.Exit(
        runner.up(
            state_dir=state_dir, fleet=fleet, port=port, ui_port=ui_port, task_queue=task_queue, timeout=timeout,
            without=without, bmc_http=bmc_http,
        )
    )  # fmt: skip


@lab_app.command("down")
def lab_down(
    state_dir: StateDir = Path(".millwright"),
    timeout: Annotated[float, typer.Option("--timeout", help="Seconds to wait before SIGKILL.")] = 30.0,
) -> None:
    """Stop every process the running lab started."""
    from lab import runner

    raise typer.Exit(runner.down(state_dir=state_dir, timeout=timeout))


@lab_app.command("seed")
def lab_seed(
    fleet: Annotated[Path, typer.Argument(help="Fleet file to load into the running lab's Kubernetes emulator.")],
    reset: Annotated[bool, typer.Option("--reset", help="Remove every object first.")] = False,
    state_dir: StateDir = Path(".millwright"),
) -> None:
    """Load a fleet into the running lab's Kubernetes emulator."""
    from lab import runner

    raise typer.Exit(runner.seed(state_dir=state_dir, fleet=fleet, reset=reset))


@lab_app.command("status")
def lab_status(state_dir: StateDir = Path(".millwright")) -> None:
    """Addresses and liveness of the lab's processes (exit 1 if no lab is running)."""
    from lab import runner

    raise typer.Exit(runner.status(state_dir=state_dir))


# ---------------------------------------------------------------- rollout plan


@rollout_app.command("plan")
def rollout_plan(
    spec_file: Annotated[str, typer.Argument(help="Rollout spec (JSON or YAML), or - for stdin.")],
    as_json: Annotated[bool, typer.Option("--json", help="Print the plan as JSON.")] = False,
    task_queue: Annotated[str, typer.Option("--task-queue", "-q", envvar="MILLWRIGHT_TASK_QUEUE")] = "millwright",
    address: AddressOpt = None,
    namespace: NamespaceOpt = None,
    state_dir: StateDir = Path(".millwright"),
) -> None:
    """Dry run: from the live node list, compartments, batches and the worst case out of service; writes nothing."""
    import yaml

    from starter.client import InputError, parse_input
    from starter.client import start as start_workflow

    spec = _spec_or_exit("Rollout")
    try:
        data = yaml.safe_load(_read_input(spec_file))
    except yaml.YAMLError as e:
        err.print(f"[red]error:[/] {spec_file} is neither JSON nor YAML: {e}")
        raise typer.Exit(2) from None
    try:
        inp = parse_input(spec, {**data, "dryRun": True} if isinstance(data, dict) else data)
    except InputError as e:
        err.print("[red]error:[/] invalid rollout spec; nothing was planned:")
        for line in e.errors:
            err.print(f"  {line}")
        raise typer.Exit(2) from None

    async def run() -> int:
        client = await _connect(address, namespace, state_dir)
        started = await start_workflow(client, inp, task_queue=task_queue, workflow=spec.name)
        result = await started.handle.result()
        if as_json:
            out.print_json(result.plan.model_dump_json(by_alias=True))
            return 0
        plan = result.plan
        out.print(
            f"rollout {plan.name} on {plan.cluster}: {plan.targeted} nodes targeted; packages in order: {', '.join(plan.package_order)}"
        )
        out.print(f"interrupt per node: {plan.interrupt.type if plan.interrupt else 'none (no drain)'}")
        for c in plan.compartments:
            sizes = ", ".join(str(len(b.nodes)) for b in c.batches)
            out.print(
                f"  {c.name}: {len(c.members)} nodes, strategy {c.strategy}, ceiling {c.ceiling}, "
                f"{len(c.unavailable)} already out of service; batches [{sizes}]; worst case {c.worst_case_out_of_service}"
            )
        out.print(f"worst case out of service at once: {plan.worst_case_out_of_service}")
        for w in plan.warnings:
            err.print(f"[yellow]warning:[/] {w}")
        return 0

    raise typer.Exit(asyncio.run(run()))


# ---------------------------------------------------------------- inventory


@inventory_app.command("bootstrap")
def inventory_bootstrap(
    task_queue: Annotated[str, typer.Option("--task-queue", "-q", envvar="MILLWRIGHT_TASK_QUEUE")] = "millwright",
    address: AddressOpt = None,
    namespace: NamespaceOpt = None,
    state_dir: StateDir = Path(".millwright"),
) -> None:
    """Create Millwright's custom fields, tags, roles in NetBox (idempotent); print what was created and what existed."""
    from temporalio.client import WorkflowFailureError

    from starter.client import start as start_workflow
    from workflows.inventory.bootstrap import InventoryBootstrapInput

    async def run() -> int:
        client = await _connect(address, namespace, state_dir)
        started = await start_workflow(client, InventoryBootstrapInput(), task_queue=task_queue)
        err.print(
            f"InventoryBootstrap {started.workflow_id} run {started.run_id}: waiting for the worker on {task_queue}"
        )
        try:
            result = await started.handle.result()
        except WorkflowFailureError as e:
            err.print("[red]InventoryBootstrap failed[/]")
            err.print(_failure_text(e))
            return 1
        for label, items in (("created", result.created), ("updated", result.updated), ("existing", result.existing)):
            out.print(f"{label} ({len(items)}):")
            for item in items:
                out.print(f"  {item}", markup=False)
        out.print("nothing changed" if not (result.created or result.updated) else "bootstrap applied")
        return 0

    raise typer.Exit(asyncio.run(run()))


# ---------------------------------------------------------------- schedules


@schedules_app.command("apply")
def schedules_apply(
    file: Annotated[Path, typer.Argument(help="Schedules file (YAML), e.g. examples/schedules.yaml.")],
    prune: Annotated[
        bool, typer.Option("--prune", help="Delete the file group's managed schedules that the file no longer lists.")
    ] = False,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="Report what would change; change nothing.")] = False,
    as_json: Annotated[bool, typer.Option("--json", help="Print the report as JSON.")] = False,
    task_queue: Annotated[
        str, typer.Option("--task-queue", "-q", envvar="MILLWRIGHT_TASK_QUEUE", help="For entries without taskQueue.")
    ] = "millwright",
    address: AddressOpt = None,
    namespace: NamespaceOpt = None,
    state_dir: StateDir = Path(".millwright"),
) -> None:
    """Create or update Temporal Schedules from FILE (validated first: exit 2 and nothing applied if invalid)."""
    from starter.schedules.apply import apply
    from starter.schedules.file import ScheduleFileError, load

    try:
        model = load(file)
    except ScheduleFileError as e:
        err.print(f"[red]error:[/] invalid schedules file {file}; nothing was applied:")
        for line in e.errors:
            err.print(f"  {line}", markup=False)
        raise typer.Exit(2) from None

    async def run() -> int:
        client = await _connect(address, namespace, state_dir)
        report = await apply(client, model, prune=prune, dry_run=dry_run, task_queue=task_queue)
        if as_json:
            out.print_json(json.dumps(report.as_dict()))
        else:
            for line in report.lines():
                out.print(line, markup=False)
        return 0

    raise typer.Exit(asyncio.run(run()))


@schedules_app.command("list")
def schedules_list(
    as_json: Annotated[bool, typer.Option("--json", help="Print the schedules as JSON.")] = False,
    address: AddressOpt = None,
    namespace: NamespaceOpt = None,
    state_dir: StateDir = Path(".millwright"),
) -> None:
    """Every schedule: ID, workflow, spec, paused, next run times, last run's status."""
    from starter.schedules.listing import list_schedules, rows_table

    async def run() -> int:
        client = await _connect(address, namespace, state_dir)
        rows = await list_schedules(client)
        if as_json:
            out.print_json(json.dumps([r.model_dump(mode="json") for r in rows]))
        elif not rows:
            out.print("no schedules")
        else:
            out.print(rows_table(rows))
        return 0

    raise typer.Exit(asyncio.run(run()))


# ---------------------------------------------------------------- entry point


def main() -> None:
    code = 0
    try:
        app(prog_name="millwright")
    except SystemExit as e:
        if isinstance(e.code, int):
            code = e.code
        elif e.code is None:
            code = 0
        else:
            print(e.code, file=sys.stderr)
            code = 1
    except KeyboardInterrupt:
        code = 130
    except Exception as e:  # one line, not a traceback wall
        print(f"millwright: error: {type(e).__name__}: {e}", file=sys.stderr)
        code = 1
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:
            pass
    os._exit(code)  # temporalio/sdk-python#300: skip interpreter finalization


if __name__ == "__main__":
    main()
