"""`millwright rollout`: plan a rollout, and the operator's controls of a running one."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Annotated

import typer

from starter.cli.common import (
    AddressOpt,
    NamespaceOpt,
    StateDir,
    connect,
    err,
    out,
    read_input,
    rollout_app,
    spec_or_exit,
)

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

    spec = spec_or_exit("Rollout")
    try:
        data = yaml.safe_load(read_input(spec_file))
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
        client = await connect(address, namespace, state_dir)
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
            for i, b in enumerate(c.batches, 1):  # batchBy: the units each batch takes whole, the gangs it stops
                if b.units:
                    gangs = ", ".join(b.gangs) or "none"
                    out.print(f"    batch {i}: {len(b.nodes)} nodes in {', '.join(b.units)}; interrupts gangs: {gangs}")
        out.print(f"worst case out of service at once: {plan.worst_case_out_of_service}")
        for w in plan.warnings:
            err.print(f"[yellow]warning:[/] {w}")
        return 0

    raise typer.Exit(asyncio.run(run()))
