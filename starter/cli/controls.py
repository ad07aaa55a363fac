"""The operator's controls: rollout pause|resume|abort|approve|retry-node|skip-node|reset-batch, budget show|set,
breaker show|reset, maintenance abort|skip-wait, remediation approve|reject, rack approve|reject, burn-in continue|abort, firmware
status|pause|resume|abort, campaign pause|resume|abort|approve.

Each is a thin call of starter/controls.py (the workflow's validated update), with --by and --reason, --dry-run
(see that module: it sends nothing) and -o. Exit 0 done; 1 the run is missing or closed, or it refused (the
validator's message); 2 a request that does not fit the update's model.

Every control takes the same options after its own (``_command``): one list of parameters, not one per command.
"""

from __future__ import annotations

import asyncio
import inspect
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
    breaker_app,
    budget_app,
    burnin_app,
    campaign_app,
    connect,
    emit,
    err,
    firmware_app,
    maintenance_app,
    mig_app,
    rack_app,
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
    str | None,
    typer.Option("--cluster", "-c", envvar="MILLWRIGHT_CLUSTER", help="The cluster (kubeconfig context)."),
]
NeedCluster = Annotated[str, typer.Option("--cluster", "-c", envvar="MILLWRIGHT_CLUSTER", help="The cluster.")]
ClusterArg = Annotated[str, typer.Argument(metavar="CLUSTER", help="The cluster (kubeconfig context).")]
NodeArg = Annotated[str, typer.Argument(metavar="NODE", help="The node.")]
RolloutArg = Annotated[str, typer.Argument(metavar="NAME", help="The run's name (with --cluster), or its full ID.")]

CONNECTION = ("output", "address", "namespace", "state_dir")


def _param(name: str, annotation: Any, default: Any = inspect.Parameter.empty) -> inspect.Parameter:
    return inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, annotation=annotation, default=default)


ASKING = [_param("output", OutputOpt, "table"), _param("address", AddressOpt, None),
          _param("namespace", NamespaceOpt, None), _param("state_dir", StateDir, Path(".millwright"))]  # fmt: skip
CONTROLLING = [_param("by", ByOpt), _param("reason", ReasonOpt), _param("dry_run", DryRunOpt, False), *ASKING]


def _command(
    group: typer.Typer, verb: str, doc: str, own: list[inspect.Parameter],
    call: Callable[[Any, dict[str, Any]], Awaitable[Any]], *, control: bool = True,
) -> None:  # fmt: skip
    """Register ``group verb``: its ``own`` parameters, then the shared ones; ``call(client, its values)``."""

    def command(**values: Any) -> None:
        conn = {k: values.pop(k) for k in CONNECTION}
        _control(lambda client: call(client, values), by=values.get("by"), **conn)

    command.__signature__ = inspect.Signature([*own, *(CONTROLLING if control else ASKING)])  # type: ignore[attr-defined]
    command.__doc__ = doc
    group.command(verb)(command)


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
            err.print(f"error: invalid request for {e.workflow}; nothing was sent:", style="red", markup=False)
            for line in e.errors:
                err.print(f"  {line}", markup=False)
            return 2
        except ControlError as e:
            err.print(f"error: {e}", style="red", markup=False)
            return 1
        if isinstance(result, Outcome):
            if result.dry_run:
                note = f": {result.note}" if result.note else ""
                err.print(f"dry run: {result.workflow_id} would take `{result.control}`{note}; nothing was sent",
                          markup=False)  # fmt: skip
            else:
                err.print(f"{result.control}: done on {result.workflow_id}", markup=False)
            result = result.state
        emit(result, output, lambda wide: lines_for(result)(result, wide))
        return 0

    raise typer.Exit(asyncio.run(run()))


# ---------------------------------------------------------------- rollout


def _fleet_id(group: str, name: str, cluster: str | None) -> str:
    from starter.controls import gpu_partitioning_id, rollout_id

    make, kind = (rollout_id, "rollout") if group == "rollout" else (gpu_partitioning_id, "gpu-partitioning")
    if cluster is None and not name.startswith(f"{kind}/"):
        err.print(f"error: give --cluster, or the run's full ID {kind}/<cluster>/{name}", style="red")
        raise typer.Exit(2)
    return make(cluster or "", name)


def _rollout(verb: str, doc: str, own: list[inspect.Parameter]) -> None:
    """``rollout <verb>`` and, the same control of the same engine, ``mig <verb>``."""
    from starter.controls import rollout_control

    for group, app in (("rollout", rollout_app), ("mig", mig_app)):

        async def call(client: Any, v: dict[str, Any], group: str = group) -> Any:
            return await rollout_control(client, verb, _fleet_id(group, v["name"], v["cluster"]), by=v["by"],
                                         reason=v["reason"], node=v.get("node"), compartment=v.get("compartment"),
                                         dry_run=v["dry_run"], group=group)  # fmt: skip

        _command(app, verb, doc, [_param("name", RolloutArg), *own, _param("cluster", ClusterOpt, None)], call)


COMPARTMENT = Annotated[
    str | None,
    typer.Option("--compartment", help="approve: this compartment's batch (default: any); reset-batch: which."),
]
_rollout("pause", "Start no more nodes; running nodes hold after their current stage.", [])
_rollout("resume", "Carry on after a pause (also one a failing gate made).", [])
_rollout("abort", "Finish the nodes in flight safely; leave every other node untouched.", [])
_rollout("approve", "Approve the next batch of a compartment waiting for approval (--by is the approver).",
         [_param("compartment", COMPARTMENT, None)])  # fmt: skip
_rollout("retry-node", "Put an erroring, blocked or skipped node back in line.", [_param("node", NodeArg)])
_rollout("skip-node", "Never touch this node in this rollout (it keeps any cordon it has).", [_param("node", NodeArg)])
_rollout("reset-batch", "Reset a compartment's batch state (NodeWright's `dp reset`): clears a stop.",
         [_param("compartment", COMPARTMENT, None)])  # fmt: skip


# ---------------------------------------------------------------- budget and breaker


def _budget_show(client: Any, v: dict[str, Any]) -> Any:
    from starter.controls import budget_show

    return budget_show(client, v["cluster"])


def _budget_set(client: Any, v: dict[str, Any]) -> Any:
    from starter.controls import budget_set

    return budget_set(client, v["cluster"], count=v["count"], percent=v["percent"], by=v["by"], reason=v["reason"],
                      nvlink_domains=_limit(v["nvlink_domains"]), gangs=_limit(v["gangs"]),
                      dry_run=v["dry_run"], task_queue=v["task_queue"])  # fmt: skip


def _limit(value: str | None) -> int | str | None:
    """`--nvlink-domains` / `--gangs`: a number, or `none` (no such limit); anything else goes to the model, which
    refuses it naming the field."""
    if value is None or not value.strip().isdigit():
        return value and value.strip().lower()
    return int(value)


def _breaker_show(client: Any, v: dict[str, Any]) -> Any:
    from starter.controls import breaker_show

    return breaker_show(client, v["cluster"])


def _breaker_reset(client: Any, v: dict[str, Any]) -> Any:
    from starter.controls import breaker_reset

    return breaker_reset(client, v["cluster"], by=v["by"], reason=v["reason"], dry_run=v["dry_run"])


CLUSTER = [_param("cluster", ClusterArg)]
_command(budget_app, "show", "The budget, the nodes out of service and why, the leases and who waits.", CLUSTER,
         _budget_show, control=False)  # fmt: skip
_command(budget_app, "set", "Declare the cluster's disruption budget (exactly one of --count or --percent; "
         "--nvlink-domains and --gangs limit those units beside it); requesters never change it.", [
    *CLUSTER,
    _param("count", Annotated[int | None, typer.Option("--count", help="At most this many nodes out of service.")],
           None),
    _param("percent", Annotated[int | None, typer.Option("--percent", help="At most this share of the nodes.")],
           None),
    _param("nvlink_domains", Annotated[str | None, typer.Option(
        "--nvlink-domains", metavar="N|none",
        help="At most N NVLink domains with any node out of service; none: no such limit; unset: unchanged.")], None),
    _param("gangs", Annotated[str | None, typer.Option(
        "--gangs", metavar="N|none",
        help="At most N gangs of GPU work disrupted at once; none: no such limit; unset: unchanged.")], None),
    _param("task_queue", Annotated[str, typer.Option("--task-queue", "-q", envvar="MILLWRIGHT_TASK_QUEUE",
                                                     help="Where to start the budget's entity if none runs.")],
           "millwright"),
], _budget_set)  # fmt: skip
_command(breaker_app, "show", "Tripped or not, why, and the nodes remediation took within the window.", CLUSTER,
         _breaker_show, control=False)  # fmt: skip
_command(breaker_app, "reset", "Close the breaker once the cause is found: automated remediation resumes.", CLUSTER,
         _breaker_reset)  # fmt: skip


# ---------------------------------------------------------------- the other families


def _maintenance_abort(client: Any, v: dict[str, Any]) -> Any:
    from starter.controls import maintenance_abort

    return maintenance_abort(client, v["cluster"], v["node"], by=v["by"], reason=v["reason"],
                             uncordon=not v["keep_cordon"], dry_run=v["dry_run"])  # fmt: skip


def _maintenance_skip_wait(client: Any, v: dict[str, Any]) -> Any:
    from starter.controls import maintenance_skip_wait

    return maintenance_skip_wait(client, v["cluster"], v["node"], by=v["by"], reason=v["reason"], dry_run=v["dry_run"])


NODE = [_param("node", NodeArg), _param("cluster", NeedCluster)]
KEEP_CORDON = Annotated[bool, typer.Option("--keep-cordon", help="Leave our cordon in place.")]
_command(maintenance_app, "abort", "Stop a node's maintenance: no further evictions; our cordon removed unless "
         "--keep-cordon.", [*NODE, _param("keep_cordon", KEEP_CORDON, False)], _maintenance_abort)  # fmt: skip
_command(maintenance_app, "skip-wait", "Stop waiting for protected pods (or the budget) and drain the node now.", NODE,
         _maintenance_skip_wait)  # fmt: skip


def _remediation(verb: str, doc: str) -> None:
    from starter.controls import remediation_decide

    def call(client: Any, v: dict[str, Any]) -> Any:
        return remediation_decide(client, verb, v["cluster"], v["node"], by=v["by"], reason=v["reason"],
                                  step=v["step"], dry_run=v["dry_run"])  # fmt: skip

    step = Annotated[str | None, typer.Option("--step", help="The step decided (default: the waiting one).")]
    _command(remediation_app, verb, doc, [*NODE, _param("step", step, None)], call)


_remediation("approve", "Approve the remediation step that waits for an operator (e.g. a power cycle).")
_remediation("reject", "Reject the step that waits for an operator: the ladder goes on without it.")


def _rack(verb: str, doc: str) -> None:
    from starter.controls import rack_decide
    from starter.racks import rack_run_id

    async def call(client: Any, v: dict[str, Any]) -> Any:
        run = await rack_run_id(client, v["cluster"], v["domain"], v["kubeconfig"])
        return await rack_decide(client, verb, run, by=v["by"], reason=v["reason"], dry_run=v["dry_run"])

    own = [_param("domain", DomainArg), _param("cluster", NeedCluster), _param("kubeconfig", KubeconfigOpt, None)]
    _command(rack_app, verb, doc, own, call)


_rack("approve", "Approve the rack's power cycle, which its RackRemediation holds for an operator.")
_rack("reject", "Reject the rack's power cycle: the domain stays out of service, quarantined with the reason.")


def _burnin(action: str, doc: str) -> None:
    from starter.controls import fleet_burnin_decide

    def call(client: Any, v: dict[str, Any]) -> Any:
        return fleet_burnin_decide(client, v["name"], action, by=v["by"], reason=v["reason"], dry_run=v["dry_run"])

    name = Annotated[str, typer.Argument(metavar="NAME", help="The fleet burn-in's name, or its full ID.")]
    _command(burnin_app, action, doc, [_param("name", name)], call)


_burnin("continue", "After a pause for too many failures: start the remaining servers.")
_burnin("abort", "After a pause for too many failures: start no more servers (running ones finish).")


def _firmware(verb: str, doc: str) -> None:
    from starter.controls import firmware_control, firmware_status

    def call(client: Any, v: dict[str, Any]) -> Any:
        if verb == "status":
            return firmware_status(client, v["name"])
        return firmware_control(client, verb, v["name"], by=v["by"], reason=v["reason"], dry_run=v["dry_run"])

    name = Annotated[str, typer.Argument(metavar="NAME", help="The fleet firmware update's name, or its full ID.")]
    _command(firmware_app, verb, doc, [_param("name", name)], call, control=verb != "status")


_firmware("status", "Every server: its wave and state; a running one's components and BMC task states.")
_firmware("pause", "Start no new server; running ones finish.")
_firmware("resume", "Carry on after a pause or a stop at the failure threshold (past the failures so far).")
_firmware("abort", "Start no new server (the rest are skipped); running ones finish.")


def _campaign(verb: str, doc: str) -> None:
    from starter.controls import campaign_control

    def call(client: Any, v: dict[str, Any]) -> Any:
        return campaign_control(client, verb, v["name"], by=v["by"], reason=v["reason"], dry_run=v["dry_run"])

    name = Annotated[str, typer.Argument(metavar="NAME", help="The campaign's name, or its full ID.")]
    _command(campaign_app, verb, doc, [_param("name", name)], call)


_campaign("pause", "Start no new cluster; the running clusters' runs pause too.")
_campaign("resume", "Carry on after a pause; the running clusters' runs resume too.")
_campaign("abort", "Start no new cluster (the rest are skipped); the running clusters' runs abort safely.")
_campaign("approve", "Let the waves after the canary start (--by is the approver).")
