"""The operator's controls: rollout pause|resume|abort|approve|retry-node|skip-node, budget show|set, breaker
show|reset, maintenance abort, remediation approve|reject, burn-in continue|abort.

Each is a thin call of starter/controls.py (the workflow's validated update), with --by and --reason, --dry-run
(see that module: it sends nothing) and -o. Exit 0 done; 1 the run is missing or closed, or it refused (the
validator's message); 2 a request that does not fit the update's model.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Annotated, Any, Optional

import typer

from starter.cli.common import (
    AddressOpt,
    NamespaceOpt,
    OutputOpt,
    StateDir,
    breaker_app,
    budget_app,
    burnin_app,
    connect,
    emit,
    err,
    maintenance_app,
    remediation_app,
    rollout_app,
)
from starter.cli.render import lines_for

ByOpt = Annotated[
    str, typer.Option("--by", envvar="MILLWRIGHT_OPERATOR", help="Who does it (recorded; env MILLWRIGHT_OPERATOR).")
]
ReasonOpt = Annotated[str, typer.Option("--reason", "-r", help="Why (recorded with the control).")]
DryRunOpt = Annotated[
    bool, typer.Option("--dry-run", help="Check that the run would take it; send nothing, change nothing.")
]
ClusterOpt = Annotated[
    Optional[str],
    typer.Option("--cluster", "-c", envvar="MILLWRIGHT_CLUSTER", help="The cluster (kubeconfig context)."),
]
ClusterArg = Annotated[str, typer.Argument(metavar="CLUSTER", help="The cluster (kubeconfig context).")]


def _control(
    call: Callable[[Any], Awaitable[Any]], *, by: str | None, output: str, address: str | None,
    namespace: str | None, state_dir: Path,
) -> None:  # fmt: skip
    """Connect (as ``by``), make the call, print what it answered; exit as the module says."""
    from starter.client import InputError
    from starter.controls import ControlError, Outcome

    async def run() -> int:
        client = await connect(address, namespace, state_dir, identity=by)
        try:
            result = await call(client)
        except InputError as e:
            err.print(f"[red]error:[/] invalid request for {e.workflow}; nothing was sent:")
            for line in e.errors:
                err.print(f"  {line}", markup=False)
            return 2
        except ControlError as e:
            err.print(f"error: {e}", style="red", markup=False)
            return 1
        if isinstance(result, Outcome):
            if result.dry_run:
                err.print(
                    f"dry run: {result.workflow_id} would take `{result.control}`"
                    + (f": {result.note}" if result.note else "")
                    + "; nothing was sent",
                    markup=False,
                )
            else:
                err.print(f"{result.control}: done on {result.workflow_id}", markup=False)
            result = result.state
        emit(result, output, lambda wide: lines_for(result)(result, wide))
        return 0

    raise typer.Exit(asyncio.run(run()))


def _rollout_id(name: str, cluster: str | None) -> str:
    from starter.controls import rollout_id

    if cluster is None and not name.startswith("rollout/"):
        err.print(f"error: give --cluster, or the rollout's full ID rollout/<cluster>/{name}", style="red")
        raise typer.Exit(2)
    return rollout_id(cluster or "", name)


def _send_rollout(verb: str, name: str, cluster: str | None, by: str, reason: str, node: str | None = None,
                  compartment: str | None = None, dry_run: bool = False, output: str = "table",
                  address: str | None = None, namespace: str | None = None,
                  state_dir: Path = Path(".millwright")) -> None:  # fmt: skip
    from starter.controls import rollout_control

    wf = _rollout_id(name, cluster)
    _control(
        lambda client: rollout_control(
            client, verb, wf, by=by, reason=reason, node=node, compartment=compartment, dry_run=dry_run
        ),
        by=by, output=output, address=address, namespace=namespace, state_dir=state_dir,
    )  # fmt: skip


NameArg = Annotated[str, typer.Argument(metavar="NAME", help="The rollout's name (with --cluster), or its full ID.")]


def _rollout_command(verb: str, doc: str) -> None:
    def command(
        name: NameArg,
        by: ByOpt,
        reason: ReasonOpt,
        cluster: ClusterOpt = None,
        compartment: Annotated[
            Optional[str], typer.Option("--compartment", help="approve: this compartment's batch (default: any).")
        ] = None,
        dry_run: DryRunOpt = False,
        output: OutputOpt = "table",
        address: AddressOpt = None,
        namespace: NamespaceOpt = None,
        state_dir: StateDir = Path(".millwright"),
    ) -> None:
        _send_rollout(verb, name, cluster, by, reason, None, compartment, dry_run, output, address, namespace,
                      state_dir)  # fmt: skip

    command.__doc__ = doc
    rollout_app.command(verb)(command)


def _rollout_node_command(verb: str, doc: str) -> None:
    def command(
        name: NameArg,
        node: Annotated[str, typer.Argument(metavar="NODE", help="The node.")],
        by: ByOpt,
        reason: ReasonOpt,
        cluster: ClusterOpt = None,
        dry_run: DryRunOpt = False,
        output: OutputOpt = "table",
        address: AddressOpt = None,
        namespace: NamespaceOpt = None,
        state_dir: StateDir = Path(".millwright"),
    ) -> None:
        _send_rollout(verb, name, cluster, by, reason, node, None, dry_run, output, address, namespace, state_dir)

    command.__doc__ = doc
    rollout_app.command(verb)(command)


_rollout_command("pause", "Start no more nodes; running nodes hold after their current stage.")
_rollout_command("resume", "Carry on after a pause (also one a failing gate made).")
_rollout_command("abort", "Finish the nodes in flight safely; leave every other node untouched.")
_rollout_command("approve", "Approve the next batch of a compartment waiting for approval (--by is the approver).")
_rollout_node_command("retry-node", "Put an erroring, blocked or skipped node back in line.")
_rollout_node_command("skip-node", "Never touch this node in this rollout (it keeps any cordon it has).")


# ---------------------------------------------------------------- budget and breaker


@budget_app.command("show")
def budget_show(
    cluster: ClusterArg,
    output: OutputOpt = "table",
    address: AddressOpt = None,
    namespace: NamespaceOpt = None,
    state_dir: StateDir = Path(".millwright"),
) -> None:
    """The budget, the nodes out of service and why, the leases and who waits."""
    from starter.controls import budget_show as show

    _control(lambda client: show(client, cluster), by=None, output=output, address=address, namespace=namespace,
             state_dir=state_dir)  # fmt: skip


@budget_app.command("set")
def budget_set(
    cluster: ClusterArg,
    by: ByOpt,
    reason: ReasonOpt,
    count: Annotated[Optional[int], typer.Option("--count", help="At most this many nodes out of service.")] = None,
    percent: Annotated[Optional[int], typer.Option("--percent", help="At most this share of the nodes.")] = None,
    dry_run: DryRunOpt = False,
    output: OutputOpt = "table",
    address: AddressOpt = None,
    namespace: NamespaceOpt = None,
    state_dir: StateDir = Path(".millwright"),
) -> None:
    """Change the cluster's disruption budget (exactly one of --count or --percent)."""
    import pydantic

    from starter.client import format_validation_error
    from starter.controls import budget_set as set_budget
    from workflows.budget.budget import Budget

    try:
        budget = Budget(count=count, percent=percent)
    except pydantic.ValidationError as e:
        err.print("error: invalid budget; nothing was sent:", style="red")
        for line in format_validation_error(e, Budget):
            err.print(f"  {line}", markup=False)
        raise typer.Exit(2) from None
    _control(
        lambda client: set_budget(client, cluster, budget, by=by, reason=reason, dry_run=dry_run),
        by=by, output=output, address=address, namespace=namespace, state_dir=state_dir,
    )  # fmt: skip


@breaker_app.command("show")
def breaker_show(
    cluster: ClusterArg,
    output: OutputOpt = "table",
    address: AddressOpt = None,
    namespace: NamespaceOpt = None,
    state_dir: StateDir = Path(".millwright"),
) -> None:
    """Tripped or not, why, and the nodes remediation took within the window."""
    from starter.controls import breaker_show as show

    _control(lambda client: show(client, cluster), by=None, output=output, address=address, namespace=namespace,
             state_dir=state_dir)  # fmt: skip


@breaker_app.command("reset")
def breaker_reset(
    cluster: ClusterArg,
    by: ByOpt,
    reason: ReasonOpt,
    dry_run: DryRunOpt = False,
    output: OutputOpt = "table",
    address: AddressOpt = None,
    namespace: NamespaceOpt = None,
    state_dir: StateDir = Path(".millwright"),
) -> None:
    """Close the breaker once the cause is found: automated remediation resumes."""
    from starter.controls import breaker_reset as reset

    _control(lambda client: reset(client, cluster, by=by, reason=reason, dry_run=dry_run), by=by, output=output,
             address=address, namespace=namespace, state_dir=state_dir)  # fmt: skip


# ---------------------------------------------------------------- the other families


@maintenance_app.command("abort")
def maintenance_abort(
    node: Annotated[str, typer.Argument(metavar="NODE")],
    cluster: Annotated[str, typer.Option("--cluster", "-c", envvar="MILLWRIGHT_CLUSTER", help="The cluster.")],
    by: ByOpt,
    reason: ReasonOpt,
    keep_cordon: Annotated[bool, typer.Option("--keep-cordon", help="Leave our cordon in place.")] = False,
    dry_run: DryRunOpt = False,
    output: OutputOpt = "table",
    address: AddressOpt = None,
    namespace: NamespaceOpt = None,
    state_dir: StateDir = Path(".millwright"),
) -> None:
    """Stop a node's maintenance: no further evictions; our cordon removed unless --keep-cordon."""
    from starter.controls import maintenance_abort as abort

    _control(
        lambda client: abort(client, cluster, node, by=by, reason=reason, uncordon=not keep_cordon, dry_run=dry_run),
        by=by, output=output, address=address, namespace=namespace, state_dir=state_dir,
    )  # fmt: skip


def _remediation_command(verb: str, doc: str) -> None:
    from starter.controls import remediation_decide

    def command(
        node: Annotated[str, typer.Argument(metavar="NODE")],
        cluster: Annotated[str, typer.Option("--cluster", "-c", envvar="MILLWRIGHT_CLUSTER", help="The cluster.")],
        by: ByOpt,
        reason: ReasonOpt,
        step: Annotated[
            Optional[str], typer.Option("--step", help="The step decided (default: the waiting one).")
        ] = None,
        dry_run: DryRunOpt = False,
        output: OutputOpt = "table",
        address: AddressOpt = None,
        namespace: NamespaceOpt = None,
        state_dir: StateDir = Path(".millwright"),
    ) -> None:
        _control(
            lambda client: remediation_decide(
                client, verb, cluster, node, by=by, reason=reason, step=step, dry_run=dry_run
            ),
            by=by, output=output, address=address, namespace=namespace, state_dir=state_dir,
        )  # fmt: skip

    command.__doc__ = doc
    remediation_app.command(verb)(command)


_remediation_command("approve", "Approve the remediation step that waits for an operator (e.g. a power cycle).")
_remediation_command("reject", "Reject the step that waits for an operator: the ladder goes on without it.")


def _burnin_command(action: str, doc: str) -> None:
    from starter.controls import fleet_burnin_decide

    def command(
        name: Annotated[str, typer.Argument(metavar="NAME", help="The fleet burn-in's name, or its full ID.")],
        by: ByOpt,
        reason: ReasonOpt,
        dry_run: DryRunOpt = False,
        output: OutputOpt = "table",
        address: AddressOpt = None,
        namespace: NamespaceOpt = None,
        state_dir: StateDir = Path(".millwright"),
    ) -> None:
        _control(
            lambda client: fleet_burnin_decide(client, name, action, by=by, reason=reason, dry_run=dry_run),
            by=by, output=output, address=address, namespace=namespace, state_dir=state_dir,
        )  # fmt: skip

    command.__doc__ = doc
    burnin_app.command(action)(command)


_burnin_command("continue", "After a pause for too many failures: start the remaining servers.")
_burnin_command("abort", "After a pause for too many failures: start no more servers (running ones finish).")
