"""`millwright schedules apply|list`: Temporal Schedules as code (starter/schedules/)."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Annotated

import typer

from starter.cli.common import AddressOpt, NamespaceOpt, StateDir, connect, err, out, schedules_app

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
        client = await connect(address, namespace, state_dir)
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
        client = await connect(address, namespace, state_dir)
        rows = await list_schedules(client)
        if as_json:
            out.print_json(json.dumps([r.model_dump(mode="json") for r in rows]))
        elif not rows:
            out.print("no schedules")
        else:
            out.print(rows_table(rows))
        return 0

    raise typer.Exit(asyncio.run(run()))
