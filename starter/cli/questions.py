"""The operator's questions: `millwright ls`, `millwright status ID`, `millwright node why NODE`, `millwright rack
why|status DOMAIN`.

Each prints a table (or lines) for a person, -o json|yaml for scripts; exit 1 when the run, node or domain is not
found."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Annotated, Any

import typer

from starter.cli.common import (
    AddressOpt,
    DomainArg,
    KubeconfigOpt,
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
    rack_app,
    table,
)
from starter.cli.render import breaker_lines, campaign_lines, lease_row, node_lines, rack_lines, rollout_lines

ClusterOpt = Annotated[str, typer.Option("--cluster", "-c", envvar="MILLWRIGHT_CLUSTER", help="The cluster.")]


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
        head += [one_line(line.replace("**", ""), 1000) for line in s.site_waits]
        p = s.progress
        if p is None:
            head += [] if s.status != "running" else ["(no progress answer: is a worker polling its queue?)"]
            return head + (campaign_lines(s.campaign, wide) if s.campaign else [])
        head.append(f"phase: {p.phase}" + (f"   {p.done}/{p.total}" if p.total else ""))
        if s.campaign is None:  # a campaign's details are its table below
            head += [line.replace("**", "").replace("`", "") for line in p.details.splitlines() if line.strip()]
        head += [one_line(w.line(), 1000) for w in p.waiting]
        head += campaign_lines(s.campaign, wide) if s.campaign else []
        return head + (rollout_lines(s.rollout, wide) if s.rollout else []) + node_lines(s.nodes, wide)

    _ask(lambda c: run_status(c, workflow_id), lines, output, address, namespace, state_dir)


@node_app.command("why")
def node_why(
    node: Annotated[str, typer.Argument(metavar="NODE")],
    cluster: ClusterOpt,
    kubeconfig: KubeconfigOpt = None,
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
    return ([f"where: {w.place.describe()}"] if w.place else []) + [gang_line(g) for g in w.gangs]


def gang_line(g: Any) -> str:
    nodes = f" on {len(g.nodes)} nodes" if len(g.nodes) > 1 else ""
    minimum = f", its PodGroup's minMember {g.min_member}" if g.min_member else ""
    return f"gang {g.id}: {g.pods} pods here{nodes} ({g.running} running, {g.gpus} GPUs){minimum}"


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


@rack_app.command("why")
def rack_why(
    domain: DomainArg,
    cluster: ClusterOpt,
    kubeconfig: KubeconfigOpt = None,
    output: OutputOpt = "table",
    address: AddressOpt = None,
    namespace: NamespaceOpt = None,
    state_dir: StateDir = Path(".millwright"),
) -> None:
    """The domain's nodes (ready, cordon, clique label, problems), the gangs on it and the runs that hold it."""
    from starter.racks import open_cluster
    from starter.racks import rack_why as why

    async def ask(client: Any) -> Any:
        async with open_cluster(cluster, kubeconfig) as (core, connector):
            return await why(client, core, connector, cluster, domain)

    _ask(ask, rack_why_lines, output, address, namespace, state_dir)


def rack_why_lines(w: Any, wide: bool) -> list[str]:
    lines = [f"rack {w.rack} on {w.cluster}: NVLink domain {w.domain or '- (no node shows a clique label)'}, "
             f"{len(w.nodes)} nodes", f"verdict: {w.verdict}", rack_holder_line(w)]  # fmt: skip
    rows = []
    for n in w.nodes:
        cordon = "-" if not n.unschedulable else f"by {n.cordoned_by}" if n.cordoned_by else "by someone else"
        rows.append([n.node, "-" if n.tray is None else str(n.tray), "Ready" if n.ready else "NotReady", cordon,
                     n.clique or "gone", one_line("; ".join(n.problems) or "-", 1000 if wide else 60),
                     n.remediation or "-"])  # fmt: skip
    lines += table(rows, ["NODE", "TRAY", "READY", "CORDONED", "CLIQUE", "PROBLEMS", "NODE REMEDIATION"])
    for n in w.nodes if wide else []:
        reasons = [("cordon", n.cordon_reason), ("quarantined", n.quarantined)]
        lines += [f"{n.node}: {note}" for note in n.notes] + [f"{n.node}: {k}: {v}" for k, v in reasons if v]
    lines += [gang_line(g) for g in w.gangs]
    return lines + [f"(could not read: {p})" for p in w.problems]


def rack_holder_line(w: Any) -> str:
    """Whether the domain's RackRemediation holds it, and where it stands."""
    run, s = w.rack_run, w.rack_state
    if run is None:
        return f"no RackRemediation has run for it ({w.workflow_id})"
    if run.status != "running":
        return f"no RackRemediation holds it: the last, {run.id}, is {run.status} (closed {age(run.closed)} ago)"
    doing = f": phase {s.phase}" + (f", {s.note}" if s.note else "") if s else " (no `status` answer)"
    return f"held by the running {run.id}{doing}"


@rack_app.command("status")
def rack_status(
    domain: DomainArg,
    cluster: ClusterOpt,
    kubeconfig: KubeconfigOpt = None,
    output: OutputOpt = "table",
    address: AddressOpt = None,
    namespace: NamespaceOpt = None,
    state_dir: StateDir = Path(".millwright"),
) -> None:
    """Where the domain's RackRemediation stands (its `status` query), or how it ended (its result)."""
    from starter.racks import rack_run_id
    from starter.racks import rack_status as status_of

    async def ask(client: Any) -> Any:
        return await status_of(client, await rack_run_id(client, cluster, domain, kubeconfig))

    def lines(s: Any, wide: bool) -> list[str]:
        head = [f"RackRemediation {s.id} ({s.status}, started {age(s.started)} ago"
                + (f", closed {age(s.closed)} ago)" if s.closed else ")")]  # fmt: skip
        if s.state is not None:
            return head + rack_lines(s.state, wide)
        r = s.result
        if r is None:
            return head
        head.append(f"outcome {r.outcome}: {r.note or r.reason}")
        head += [f"{what}: {', '.join(nodes)}" for what, nodes in (("returned", r.returned), ("held out", r.held_out),
                 ("handed to their NodeRemediation", r.handed_to_node_remediation)) if nodes]  # fmt: skip
        head.append(f"trays power-cycled: {r.power_cycles}" + (f"; domain check {r.domain_check}" if r.domain_check
                    else ""))  # fmt: skip
        return head

    _ask(ask, lines, output, address, namespace, state_dir)


@node_app.command("logs")
def node_logs(
    node: Annotated[str, typer.Argument(metavar="NODE")],
    cluster: ClusterOpt,
    stage: Annotated[str | None, typer.Option("--stage", "-s", help="Only this stage (apply, interrupt...).")] = None,
    follow: Annotated[
        bool, typer.Option("--follow", "-f", help="Keep printing what new or running stage Jobs print, until Ctrl-C.")
    ] = False,
    interval: Annotated[float, typer.Option("--interval", help="With -f: seconds between looks.")] = 2.0,
    kubeconfig: KubeconfigOpt = None,
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
