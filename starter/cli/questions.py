"""The operator's questions: `millwright ls`, `millwright status ID`, `millwright node why NODE`.

Each prints a table (or lines) for a person, -o json|yaml for scripts; exit 1 when the run or node is not found."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Annotated, Any

import typer

from starter.cli.common import (
    AddressOpt,
    NamespaceOpt,
    OutputOpt,
    StateDir,
    age,
    app,
    connect,
    emit,
    err,
    node_app,
    one_line,
    out,
    table,
)
from starter.cli.render import breaker_lines, lease_row, node_lines, rollout_lines


def _ask(
    ask: Callable[[Any], Awaitable[Any]], lines: Callable[[Any, bool], list[str]], output: str,
    address: str | None, namespace: str | None, state_dir: Path,
) -> None:  # fmt: skip
    from starter.controls import ControlError

    async def run() -> int:
        client = await connect(address, namespace, state_dir)
        try:
            answer = await ask(client)
        except ControlError as e:
            err.print(f"error: {e}", style="red", markup=False)
            return 1
        emit(answer, output, lambda wide: lines(answer, wide))
        return 0

    raise typer.Exit(asyncio.run(run()))


@app.command("ls")
def ls(
    cluster: Annotated[str | None, typer.Option("--cluster", "-c", help="Only this cluster's.")] = None,
    family: Annotated[str | None, typer.Option("--family", "-f", help="Only this workflow type.")] = None,
    phase: Annotated[str | None, typer.Option("--phase", "-p", help="Only runs in this MillwrightPhase.")] = None,
    all: Annotated[bool, typer.Option("--all", "-A", help="Closed runs too (recent first).")] = False,
    output: OutputOpt = "table",
    address: AddressOpt = None,
    namespace: NamespaceOpt = None,
    state_dir: StateDir = Path(".millwright"),
) -> None:
    """The operations running (with --all, recent ones too), one line each, from the search attributes."""
    from starter.questions import list_operations

    def lines(ops: list[Any], wide: bool) -> list[str]:
        if not ops:
            return ["no operations" + ("" if all else " running (--all for closed ones)")]
        header = ["ID", "FAMILY", "CLUSTER", "PHASE", "PROGRESS", "AGE"] + (
            ["STATUS", "NODE", "TASK QUEUE"] if wide else []
        )
        rows = [
            [o.id, o.family, o.cluster or "-", o.phase or "-", o.progress or "-", age(o.started)]
            + ([o.status, o.node or "-", o.task_queue] if wide else [])
            for o in ops
        ]
        return table(rows, header)

    _ask(lambda c: list_operations(c, cluster=cluster, family=family, phase=phase, all=all), lines, output,
         address, namespace, state_dir)  # fmt: skip


@app.command("status")
def status(
    workflow_id: Annotated[str, typer.Argument(metavar="ID", help="Workflow ID (see `millwright ls`).")],
    output: OutputOpt = "table",
    address: AddressOpt = None,
    namespace: NamespaceOpt = None,
    state_dir: StateDir = Path(".millwright"),
) -> None:
    """Where one run stands: its progress (phase, done of total, what it waits for), for a person or -o json|yaml."""
    from starter.questions import run_status

    def lines(s: Any, wide: bool) -> list[str]:
        head = [f"{s.family} {s.id} ({s.status}, started {age(s.started)} ago)"]
        p = s.progress
        if p is None:
            return head + ([] if s.status != "running" else ["(no progress answer: is a worker polling its queue?)"])
        head.append(f"phase: {p.phase}" + (f"   {p.done}/{p.total}" if p.total else ""))
        head += [line.replace("**", "").replace("`", "") for line in p.details.splitlines() if line.strip()]
        head += [one_line(w.line(), 1000) for w in p.waiting]
        return head + (rollout_lines(s.rollout, wide) if s.rollout else []) + node_lines(s.nodes, wide)

    _ask(lambda c: run_status(c, workflow_id), lines, output, address, namespace, state_dir)


@node_app.command("why")
def node_why(
    node: Annotated[str, typer.Argument(metavar="NODE")],
    cluster: Annotated[str, typer.Option("--cluster", "-c", envvar="MILLWRIGHT_CLUSTER", help="The cluster.")],
    kubeconfig: Annotated[
        str | None,
        typer.Option("--kubeconfig", envvar="MILLWRIGHT_KUBECONFIG", help="As the worker's (default $KUBECONFIG)."),
    ] = None,
    output: OutputOpt = "table",
    address: AddressOpt = None,
    namespace: NamespaceOpt = None,
    state_dir: StateDir = Path(".millwright"),
) -> None:
    """Everything that holds or touches one node: cordon and who placed it, leases, runs, breaker, Events."""
    from starter.questions import core_api
    from starter.questions import node_why as why

    async def ask(client: Any) -> Any:
        core, connector = await core_api(cluster, kubeconfig)
        try:
            return await why(client, core, cluster, node)
        finally:
            await connector.close()

    _ask(ask, why_lines, output, address, namespace, state_dir)


def why_lines(w: Any, wide: bool) -> list[str]:
    state = "cordoned" if w.unschedulable else "schedulable"
    lines = [f"node {w.node} on {w.cluster}: {state}, {'Ready' if w.ready else 'NotReady'}", *place_lines(w)]
    if w.cordoned_by:
        lines.append(f"cordoned by Millwright run {w.cordoned_by}: {w.cordon_reason or '(no reason recorded)'}")
        if not w.quarantine or (w.cordon_holder and w.cordon_holder.status == "running"):  # a quarantine says why
            lines.append(cordon_holder_line(w))
    if w.foreign_cordon:
        lines.append("cordoned by someone else (no Millwright cordon annotation): Millwright never removes it")
    if w.rollout:
        r = w.rollout
        lines.append(f"rollout {r.get('rollout')}: {r.get('state')}" + (f", {r.get('package')} stage {r.get('stage')}"
                     if r.get("stage") else "") + (f": {r['reason']}" if r.get("reason") else ""))  # fmt: skip
    if w.quarantine:
        q = w.quarantine
        lines.append(f"quarantined by {q.get('by')} at {q.get('at')}: {q.get('reason')}")
    if w.last_remediation:
        lines.append("last remediation: " + ", ".join(f"{k} {v}" for k, v in w.last_remediation.items()))
    if w.out_of_service:
        lines.append(f"out of service for the disruption budget: {w.out_of_service}")
    if w.leases:
        lines += table([lease_row(lease, wide) for lease in w.leases], ["NODE", "LEASE", "HOLDER", "STATE", "NOTE"])
    for c in w.conditions:
        lines.append(f"condition {c['type']}={c['status']} {c['reason']}: {c['message']}".rstrip(": "))
    if w.breaker:
        lines += breaker_lines(w.breaker, wide)[:1]
    if w.remediation:
        rem = w.remediation
        lines.append(f"last remediation {rem.id}: {rem.status}, started {age(rem.started)} ago"
                     + (f", closed {age(rem.closed)} ago" if rem.closed else ""))  # fmt: skip
    if w.runs:
        lines += table([[r.id, r.family, r.phase or "-", r.status, age(r.started)] for r in w.runs],
                       ["RUN ON THIS NODE", "FAMILY", "PHASE", "STATUS", "AGE"])  # fmt: skip
    if w.events:
        lines += table([[e.at, e.type, e.reason, one_line(e.message, 1000 if wide else 80)] for e in w.events],
                       ["EVENT AT", "TYPE", "REASON", "MESSAGE"])  # fmt: skip
    lines += [f"(could not read: {p})" for p in w.problems]
    return lines


def place_lines(w: Any) -> list[str]:
    """Where the node sits, and the gangs of GPU work on it (docs/topology-and-gangs.md)."""
    lines = [f"where: {w.place.describe()}"] if w.place else []
    for g in w.gangs:
        minimum = f", its PodGroup's minMember {g.min_member}" if g.min_member else ""
        lines.append(f"gang {g.id}: {g.pods} pods here ({g.running} running, {g.gpus} GPUs){minimum}")
    return lines


def cordon_holder_line(w: Any) -> str:
    """Whether a run still holds Millwright's cordon, and what it waits for; else who must act."""
    h = w.cordon_holder
    if h is not None and h.status == "running":
        p = h.progress
        doing = f", phase {p.phase}: {p.details}" if p is not None else ""
        return f"  held by this running run ({h.family}){doing}"
    if h is not None:
        return (f"  no run holds it: {h.id} is {h.status} (closed {age(h.closed)} ago); the node stays cordoned until "
                "an operator uncordons it or a new run takes it on")  # fmt: skip
    return f"  no run holds it: no run {w.cordoned_by} was found; an operator must uncordon it or start a run for it"


@node_app.command("logs")
def node_logs(
    node: Annotated[str, typer.Argument(metavar="NODE")],
    cluster: Annotated[str, typer.Option("--cluster", "-c", envvar="MILLWRIGHT_CLUSTER", help="The cluster.")],
    stage: Annotated[str | None, typer.Option("--stage", "-s", help="Only this stage (apply, interrupt...).")] = None,
    follow: Annotated[
        bool, typer.Option("--follow", "-f", help="Keep printing what new or running stage Jobs print, until Ctrl-C.")
    ] = False,
    interval: Annotated[float, typer.Option("--interval", help="With -f: seconds between looks.")] = 2.0,
    kubeconfig: Annotated[
        str | None,
        typer.Option("--kubeconfig", envvar="MILLWRIGHT_KUBECONFIG", help="As the worker's (default $KUBECONFIG)."),
    ] = None,
    output: OutputOpt = "table",
) -> None:
    """What the stage Jobs Millwright ran on NODE printed, oldest first (kubectl logs of each, with a header)."""
    from starter.questions import core_api
    from starter.questions import node_logs as logs

    async def run() -> int:
        core, connector = await core_api(cluster, kubeconfig)
        printed: dict[str, int] = {}  # pod -> characters of its log already printed
        try:
            while True:
                found = await logs(core, node, stage=stage)
                if output in ("json", "yaml"):
                    emit(found, output, lambda wide: [])
                    return 0
                for s in found:
                    if s.pod not in printed:
                        out.print(f"==> {s.pod} ({s.package} {s.stage}, {s.phase}; rollout {s.rollout or '?'}) <==",
                                  markup=False, style="bold")  # fmt: skip
                    out.print(s.log[printed.get(s.pod, 0) :], end="", markup=False)
                    printed[s.pod] = len(s.log)
                if not follow:
                    if not found:
                        err.print(f"no stage Jobs of Millwright's on {node}" + (f" for stage {stage}" if stage else ""))
                    return 0
                await asyncio.sleep(interval)
        finally:
            await connector.close()

    raise typer.Exit(asyncio.run(run()))
