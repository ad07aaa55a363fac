"""Query answers as lines for a person: a rollout's status, a budget, a breaker, a rack's remediation; anything else
as YAML."""

from __future__ import annotations

from typing import Any

import yaml

from starter.cli.common import jsonable, one_line, table
from workflows.budget.book import budget_text


def rollout_lines(s: Any, wide: bool) -> list[str]:
    lines = [f"phase: {s.phase}" + "".join(f"  {k}={v}" for k, v in sorted(s.counts.items()))]
    if s.paused_reason:
        lines.append(f"paused: {s.paused_reason}")
    if s.aborted:
        lines.append(f"aborting: {s.aborted}")
    rows = []
    for name, c in sorted(s.compartments.items()):
        b = c.current_batch
        batch = f"{b.number} ({b.completed}/{len(b.order)} complete)" if b else "-"
        rows.append([name, c.phase, c.strategy, str(c.members), str(c.ceiling), batch, c.note if wide else ""])
    if rows:
        lines += table(rows, ["COMPARTMENT", "PHASE", "STRATEGY", "NODES", "CEILING", "BATCH", "NOTE" if wide else ""])
    if s.problems:
        lines += table(
            [
                [n, v.status, str(v.retries), one_line(v.reason, 1000 if wide else 100)]
                for n, v in sorted(s.problems.items())
            ],
            ["NODE", "STATUS", "RETRIES", "REASON"],
        )
    return lines


def campaign_lines(s: Any, wide: bool) -> list[str]:
    """A campaign's `status`: what it waits for, then every cluster: its wave, state, run, counts, why."""
    lines = [f"campaign: {s.phase}" + (f", {s.failed} failed of {s.max_failed_clusters} allowed" if s.failed else "")]
    lines += [f"waiting for: {s.waiting_for}"] if s.waiting_for else []
    lines += [f"approved by: {s.approved_by}"] if s.approved_by else []
    rows = [[c, str(o.wave), o.state, o.workflow_id or "-", " ".join(f"{k}={v}" for k, v in sorted(o.counts.items()))
             or "-", one_line(o.error or "-", 1000 if wide else 80)] for c, o in s.clusters.items()]  # fmt: skip
    return lines + table(rows, ["CLUSTER", "WAVE", "STATE", "RUN", "NODES", "WHY"])


def node_lines(nodes: dict[str, Any], wide: bool) -> list[str]:
    """A rollout's nodes being updated now: where each stands (stage, what it runs, its drain, paused)."""
    rows = []
    for name, n in nodes.items():
        drain = f"{len(n.evicted)}/{n.to_evict} evicted" + (f", {len(n.blocked)} blocked" if n.blocked else "")
        running = ", ".join(n.running) or "-"
        rows.append([name, n.stage + (" (paused)" if n.paused else ""), n.package or "-",
                     one_line(running, 1000 if wide else 60), drain if n.to_evict else "-"])  # fmt: skip
    return table(rows, ["NODE", "STAGE", "PACKAGE", "RUNNING", "DRAIN"]) if rows else []


def budget_lines(s: Any, wide: bool) -> list[str]:
    lines = [
        f"cluster {s.cluster}: budget {budget_text(s.budget)} ({s.budget_source}); allowed out of service "
        f"{s.allowed} of {s.total_nodes} nodes (read {s.checked_at.isoformat() if s.checked_at else 'never'})"
    ]
    lines += [f"requester {who}: {line}" for who, line in s.own_budgets.items()]
    if s.limits.nvlink_domains is not None:
        lines.append(
            f"NVLink domains with nodes out of service: {len(s.domains_out)} of {s.limits.nvlink_domains} "
            "allowed" + "".join(f"; {d}: {', '.join(nodes)}" for d, nodes in sorted(s.domains_out.items()))
        )
    if s.limits.gangs is not None:
        lines.append(f"gangs disrupted: {len(s.gangs_disrupted)} of {s.limits.gangs} allowed")
        lines += [f"  {gang}: {why}" for gang, why in sorted(s.gangs_disrupted.items())]
    if s.error:
        lines.append(f"last read failed: {s.error}")
    if s.out_of_service:
        rows = [[n, why, s.places.get(n, "")] for n, why in sorted(s.out_of_service.items())]
        lines += table(rows, ["NODE", "OUT OF SERVICE BECAUSE", "PLACE" if s.places else ""])
    leases = [*s.leases, *s.queue]
    if leases:
        lines += table([lease_row(lease, wide) for lease in leases], ["NODE", "LEASE", "HOLDER", "STATE", "NOTE"])
    return lines


def lease_row(lease: Any, wide: bool) -> list[str]:
    state = f"{lease.state} (place {lease.position})" if lease.state == "queued" else lease.state
    return [lease.node, lease.id, lease.holder, state, one_line(lease.note or lease.reason, 1000 if wide else 60)]


def breaker_lines(s: Any, wide: bool) -> list[str]:
    lines = [s.line()]
    lines.append(f"trips: {s.trips}  refused since the trip: {s.refused}")
    if s.reset:
        lines.append(f"last reset: {s.reset}")
    if s.taken:
        lines += table([[t.node, t.holder, t.at.isoformat()] for t in s.taken], ["NODE TAKEN", "BY", "AT"])
    return lines


def rack_lines(s: Any, wide: bool) -> list[str]:
    """A RackRemediation's `status` answer: its phase, every node (tray, verdict, drain, power), the power order."""
    lines = [f"phase: {s.phase}   rack {s.rack or '-'}, NVLink domain {s.domain or '-'}, "
             f"leased {'yes' if s.lease else 'no'}"]  # fmt: skip
    if s.awaiting_approval:
        lines.append(f"awaiting approval of {s.awaiting_approval}: millwright rack approve|reject")
    rows = []
    for n in s.nodes:
        drain = f"{len(n.evicted)}/{n.to_evict} evicted" + (f", {len(n.blocked)} blocked" if n.blocked else "")
        rows.append([n.node, "-" if n.tray is None else str(n.tray), n.verdict, "yes" if n.cordoned_by_us else "no",
                     drain if n.to_evict else "-", ", ".join(n.powered) or "-",
                     one_line(n.detail or "-", 1000 if wide else 60)])  # fmt: skip
    if rows:
        lines += table(rows, ["NODE", "TRAY", "VERDICT", "CORDONED BY IT", "DRAIN", "POWERED", "DETAIL"])
    if s.power_order:
        lines.append(
            "power order (off in this order; on: switch trays, then compute trays): " + ", ".join(s.power_order)
        )
    if s.domain_check:
        lines.append(f"domain check: {s.domain_check}")
    if s.note:
        lines.append(f"note: {s.note}")
    return lines


def any_lines(value: Any, wide: bool) -> list[str]:
    return yaml.safe_dump(jsonable(value), sort_keys=False).rstrip().splitlines()


def lines_for(value: Any) -> Any:
    """The renderer for a query answer's type."""
    return {"RolloutStatus": rollout_lines, "BudgetView": budget_lines, "BreakerView": breaker_lines,
            "RackRemediationStatus": rack_lines, "CampaignStatus": campaign_lines}.get(type(value).__name__, any_lines)  # fmt: skip
