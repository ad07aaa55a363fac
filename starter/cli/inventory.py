"""`millwright inventory bootstrap`: Millwright's custom fields, tags and roles in NetBox."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Annotated

import typer

from starter.cli.common import AddressOpt, NamespaceOpt, StateDir, connect, err, failure_text, inventory_app, out

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
        client = await connect(address, namespace, state_dir)
        started = await start_workflow(client, InventoryBootstrapInput(), task_queue=task_queue)
        err.print(
            f"InventoryBootstrap {started.workflow_id} run {started.run_id}: waiting for the worker on {task_queue}"
        )
        try:
            result = await started.handle.result()
        except WorkflowFailureError as e:
            err.print("[red]InventoryBootstrap failed[/]")
            err.print(failure_text(e))
            return 1
        for label, items in (("created", result.created), ("updated", result.updated), ("existing", result.existing)):
            out.print(f"{label} ({len(items)}):")
            for item in items:
                out.print(f"  {item}", markup=False)
        out.print("nothing changed" if not (result.created or result.updated) else "bootstrap applied")
        return 0

    raise typer.Exit(asyncio.run(run()))
