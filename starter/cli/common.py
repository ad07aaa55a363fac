"""What every command shares: the Typer apps, the consoles, the connection options, input and output helpers."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from types import ModuleType
from typing import Annotated, Any, Literal

import typer
import yaml
from rich.console import Console

app = typer.Typer(
    name="millwright",
    help="Start, watch, control and question Millwright operations (GPU AI-factory operations on Temporal).",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
)


def _group(name: str, help: str) -> typer.Typer:
    group = typer.Typer(help=help, no_args_is_help=True)
    app.add_typer(group, name=name)
    return group


lab_app = _group("lab", "The emulated lab: Temporal dev server + Kubernetes emulator + worker.")
inventory_app = _group("inventory", "Inventory in NetBox (the worker holds the NetBox URL and token).")
rollout_app = _group("rollout", "Progressive host-OS rollouts (NodeWright-style): plan, and control a running one.")
schedules_app = _group("schedules", "Temporal Schedules as code: apply a YAML file of schedules, list them.")
budget_app = _group("budget", "A cluster's disruption budget: how many nodes may be out of service at once.")
breaker_app = _group("breaker", "A cluster's remediation circuit breaker.")
maintenance_app = _group("maintenance", "Controls of a running NodeMaintenance.")
remediation_app = _group("remediation", "Controls of a running NodeRemediation (its operator-approved steps).")
mig_app = _group("mig", "Controls of a running GpuPartitioning (MIG layouts across a fleet), as a rollout's.")
burnin_app = _group("burn-in", "Controls of a running FleetBurnIn (after it paused for too many failures).")
firmware_app = _group("firmware", "A running FleetFirmwareUpdate: its servers' state, and pause, resume, abort.")
campaign_app = _group(
    "campaign", "A running campaign across clusters (FleetRollout, FleetGpuPartitioning, FirmwareCampaign)."
)
node_app = _group("node", "One node: why it is out of service, and its stage Jobs' logs.")
rack_app = _group("rack", "A whole NVLink domain (an NVL72 rack): what its nodes show, its RackRemediation.")


def _print_version(value: bool) -> None:
    if value:
        from worker.version import version

        print(f"millwright {version()}")
        raise typer.Exit(0)


@app.callback()
def _root(
    _version: Annotated[
        bool, typer.Option("--version", callback=_print_version, is_eager=True, help="Print the version and exit.")
    ] = False,
) -> None:
    """Start, watch, control and question Millwright operations (GPU AI-factory operations on Temporal).

    Exit codes: 0 success; 1 failure (a run failed or refused a control, a run or node not found, a connection
    error); 2 bad usage or input (unknown command or workflow, input that does not fit the model)."""


out = Console(highlight=False, soft_wrap=True)
err = Console(stderr=True, highlight=False, soft_wrap=True)

DEFAULT_UI = "http://127.0.0.1:8233"

StateDir = Annotated[
    Path,
    typer.Option("--state-dir", envvar="MILLWRIGHT_STATE_DIR", help="Lab state directory (lab.json, logs, databases)."),
]
AddressOpt = Annotated[
    str | None,
    typer.Option(
        "--address",
        help="Temporal frontend host:port. Default: TEMPORAL_ADDRESS / TEMPORAL_PROFILE, else the running lab, else localhost:7233.",
    ),
]
NamespaceOpt = Annotated[
    str | None, typer.Option("--namespace", help="Temporal namespace (default: TEMPORAL_NAMESPACE or 'default').")
]
KubeconfigOpt = Annotated[
    str | None,
    typer.Option("--kubeconfig", envvar="MILLWRIGHT_KUBECONFIG", help="As the worker's (default $KUBECONFIG)."),
]
DomainArg = Annotated[
    str, typer.Argument(metavar="DOMAIN", help="An NVLink domain: its rack (e.g. rack-001) or its ClusterUUID.")
]
UiOpt = Annotated[
    str | None,
    typer.Option(
        "--ui",
        envvar="MILLWRIGHT_UI_URL",
        help="Temporal Web UI base URL for links (default: the running lab's, else http://127.0.0.1:8233).",
    ),
]


# ---------------------------------------------------------------- helpers


def lab_runner() -> ModuleType | None:
    """lab/runner.py, or None where this install has no lab: the worker image leaves lab/ out (deploy/Dockerfile).
    The one place outside lab/ that imports it, and only when a command asks (tests/test_architecture.py)."""
    try:
        from lab import runner
    except ModuleNotFoundError as missing:
        if missing.name != "lab":
            raise
        return None
    return runner


def running_lab(state_dir: Path) -> dict[str, Any] | None:
    """The running lab's addresses, so `start` and `watch` find it without flags (none where the lab is not
    installed)."""
    runner = lab_runner()
    return runner.running_lab(state_dir) if runner else None


def ui_base(ui: str | None, state_dir: Path) -> str:
    if ui:
        return ui
    lab = running_lab(state_dir)
    if lab and lab.get("ui"):
        return str(lab["ui"])
    return DEFAULT_UI


def connect_kwargs(
    address: str | None, namespace: str | None, state_dir: Path, identity: str | None = None
) -> dict[str, Any]:
    from starter.client import connect_config

    lab = running_lab(state_dir)
    lab_address = ((lab or {}).get("temporal") or {}).get("address")
    return connect_config(default_address=lab_address, target_host=address, namespace=namespace, identity=identity)


async def connect(address: str | None, namespace: str | None, state_dir: Path, identity: str | None = None):
    """A client; ``identity`` (an operator's --by) is what the server records as the caller of every request."""
    from temporalio.client import Client

    kwargs = connect_kwargs(address, namespace, state_dir, identity)
    try:
        return await Client.connect(**kwargs)
    except Exception as e:
        err.print(
            f"[red]error:[/] cannot connect to Temporal at {kwargs['target_host']} (namespace {kwargs['namespace']}): {e}"
        )
        raise typer.Exit(1) from None


def read_input(source: str) -> str:
    if source == "-":
        return sys.stdin.read()
    try:
        return Path(source).read_text()
    except OSError as e:
        err.print(f"[red]error:[/] cannot read input {source}: {e.strerror or e}")
        raise typer.Exit(2) from None


def spec_or_exit(name: str):
    from starter.client import UnknownWorkflowError, workflow_by_name

    try:
        return workflow_by_name(name)
    except UnknownWorkflowError as e:
        err.print(f"[red]error:[/] unknown workflow {name!r}. Known workflows: {', '.join(e.known) or '(none)'}")
        raise typer.Exit(2) from None


def one_line(markdown: str, limit: int = 120) -> str:
    """Progress details are markdown for the UI; the terminal bar gets one plain line."""
    text = " · ".join(line.strip() for line in markdown.replace("**", "").replace("`", "").splitlines() if line.strip())
    return text if len(text) <= limit else text[: limit - 1] + "…"


def failure_text(e: BaseException) -> str:
    lines = []
    cur: BaseException | None = getattr(e, "cause", None) or e
    while cur is not None:
        msg = getattr(cur, "message", None) or str(cur)
        kind = getattr(cur, "type", None) or type(cur).__name__
        lines.append(f"{kind}: {msg}")
        cur = getattr(cur, "cause", None) or cur.__cause__
    return "\n".join(lines) if lines else str(e)


def jsonable(value: Any) -> Any:
    from pydantic import BaseModel

    if isinstance(value, BaseModel):
        return value.model_dump(mode="json")
    if isinstance(value, list):  # `ls`: one document, a list of rows
        return [jsonable(v) for v in value]
    return value


# ---------------------------------------------------------------- output, kubectl's way


OutputOpt = Annotated[
    Literal["table", "wide", "json", "yaml"],
    typer.Option("--output", "-o", help="table (default), wide, json or yaml."),
]


def emit(value: Any, output: str, lines: Callable[[bool], list[str]]) -> None:
    """``value`` as JSON or YAML for scripts, else the lines for a person (``lines(wide)``)."""
    if output in ("json", "yaml"):
        data = jsonable(value)
        if output == "json":
            out.print(json.dumps(data, indent=2), markup=False)
        else:
            out.print(yaml.safe_dump(data, sort_keys=False).rstrip(), markup=False)
        return
    for line in lines(output == "wide"):
        out.print(line, markup=False)


def table(rows: list[list[str]], header: list[str]) -> list[str]:
    """Columns padded to their widest cell, upper-case headers, three spaces apart: as `kubectl get` prints."""
    cells = [header, *rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(header))]
    return ["   ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in cells]


def age(since: datetime | None, now: datetime | None = None) -> str:
    """kubectl's age: 45s, 12m, 3h, 5d."""
    if since is None:
        return "<unknown>"
    seconds = int(((now or datetime.now(UTC)) - since).total_seconds())
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{seconds // size}{unit}"
    return f"{max(seconds, 0)}s"
