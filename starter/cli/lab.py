"""`millwright lab up|down|seed|status`: the emulated lab (lab/runner.py)."""

from __future__ import annotations

from pathlib import Path
from types import ModuleType
from typing import Annotated

import typer

from starter.cli.common import StateDir, err, lab_app, lab_runner

# ---------------------------------------------------------------- lab


def _runner() -> ModuleType:
    runner = lab_runner()
    if runner is None:
        err.print("[red]error:[/] no lab in this install (the worker image leaves lab/ out): run it from a checkout")
        raise typer.Exit(2)
    return runner


@lab_app.command("up")
def lab_up(
    state_dir: StateDir = Path(".millwright"),
    fleet: Annotated[
        Path | None, typer.Option("--fleet", help="Fleet file to seed a fresh lab (default lab/fleets/demo.json).")
    ] = None,
    port: Annotated[int, typer.Option("--port", help="Temporal gRPC port (0 = any free port).")] = 7233,
    ui_port: Annotated[int, typer.Option("--ui-port", help="Temporal Web UI port (0 = any free port).")] = 8233,
    task_queue: Annotated[str, typer.Option("--task-queue")] = "millwright",
    timeout: Annotated[float, typer.Option("--timeout", help="Seconds to wait for everything to come up.")] = 60.0,
    without: Annotated[
        list[str] | None,
        typer.Option(
            "--without",
            metavar="SERVICE[,SERVICE]",
            envvar="MILLWRIGHT_LAB_WITHOUT",
            help="Leave services out: netbox, ufm, webhook, prometheus, nvl72 (the NVL72 cluster, its trays' BMCs "
            "and rack faults), bmcs (with their host agents).",
        ),
    ] = None,
    bmc_http: Annotated[
        bool, typer.Option("--bmc-http", help="The BMCs answer plain HTTP instead of HTTPS with the lab CA.")
    ] = False,
    sites: Annotated[
        int | None,
        typer.Option(
            "--sites",
            metavar="N",
            help="N sites (2 or more): site-1..site-N, each its own Kubernetes emulator (cluster lab-1..lab-N), BMCs "
            "and site worker (MILLWRIGHT_SITE); a central worker with the site map and no kubeconfig. Leaves out "
            "NetBox, UFM, Prometheus, NVL72 and the host agents.",
        ),
    ] = None,
) -> None:
    """Start the lab on 127.0.0.1 and block until Ctrl-C or `millwright lab down`."""
    runner = _runner()
    raise typer.Exit(
        runner.up(
            state_dir=state_dir, fleet=fleet, port=port, ui_port=ui_port, task_queue=task_queue, timeout=timeout,
            without=without, bmc_http=bmc_http, sites=sites,
        )
    )  # fmt: skip


@lab_app.command("down")
def lab_down(
    state_dir: StateDir = Path(".millwright"),
    timeout: Annotated[float, typer.Option("--timeout", help="Seconds to wait before SIGKILL.")] = 30.0,
) -> None:
    """Stop every process the running lab started."""
    runner = _runner()
    raise typer.Exit(runner.down(state_dir=state_dir, timeout=timeout))


@lab_app.command("seed")
def lab_seed(
    fleet: Annotated[
        Path,
        typer.Argument(
            help="Fleet file to load into the running lab's Kubernetes emulator (with --sites: into every "
            "site's, as its cluster)."
        ),
    ],
    reset: Annotated[bool, typer.Option("--reset", help="Remove every object first.")] = False,
    state_dir: StateDir = Path(".millwright"),
) -> None:
    """Load a fleet into the running lab's Kubernetes emulator."""
    runner = _runner()
    raise typer.Exit(runner.seed(state_dir=state_dir, fleet=fleet, reset=reset))


@lab_app.command("status")
def lab_status(state_dir: StateDir = Path(".millwright")) -> None:
    """Addresses and liveness of the lab's processes (exit 1 if no lab is running)."""
    runner = _runner()
    raise typer.Exit(runner.status(state_dir=state_dir))
