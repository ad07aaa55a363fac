"""Which stages a node's update runs, from the packages the node has: NodeWright's node sequence as data, and the
stage itself as its Job runs it.

One function for the workflow that plans a node's stages after its start (workflows/rollout/node_update.py) and
for the activity that starts a node and runs its stages in one call (`run_node_stages` with `start`), so both
make the same stages from the same facts.
"""

from __future__ import annotations

from pydantic import Field

from activities.models import StrictModel


class NodeStage(StrictModel):
    """One stage of one package, as its Job runs it."""

    package: str
    version: str
    image: str = Field(description="Image without tag; the Job runs f'{image}:{version}'.")
    stage: str = Field(description="A `Stage`'s name: apply|upgrade|config|interrupt|post-interrupt|uninstall|...")
    interrupt: str | None = Field(None, description="For stage interrupt: reboot|service|restartAllServices|noop.")
    services: list[str] = Field(default_factory=list)
    config: dict[str, str] = Field(default_factory=dict, description="The package's configMap, given to the Job.")
    timeout_seconds: float = Field(3600, gt=0, description="Job activeDeadlineSeconds, and how long to wait.")
    command: list[str] = Field(
        default_factory=list, description="For stage validate: the container's command (else the image's own)."
    )


class PackagePlan(StrictModel):
    name: str
    version: str
    image: str
    config: dict[str, str] = Field(default_factory=dict)
    has_interrupt: bool = False
    timeout_seconds: float = Field(3600, gt=0)


class InterruptPlan(StrictModel):
    type: str = Field(description="reboot|service|restartAllServices|noop")
    services: list[str] = Field(default_factory=list)


class NodePlan(StrictModel):
    """A rollout's packages for every node; `stages_for` makes one node's stages from what it has installed."""

    packages: list[PackagePlan] = Field(description="To install, in dependency order.")
    uninstall: list[PackagePlan] = Field(default_factory=list, description="To uninstall where installed, "
                                         "dependents first.")  # fmt: skip
    interrupt: InterruptPlan | None = None
    uninstall_interrupt: InterruptPlan | None = None

    def stages_for(self, installed: dict[str, str]) -> tuple[list[NodeStage], dict[str, str], list[str]]:
        """(the stages, in order; package -> version they install; the packages they uninstall): NodeWright's
        uninstall lane (each uninstall, then one uninstall-interrupt), then each due package's apply|upgrade and
        config, one coalesced interrupt, the post-interrupt stages. The last two are the finish's."""
        due = [p for p in self.packages if installed.get(p.name) != p.version]
        # What it uninstalls runs the scripts of the version the node has.
        removing = [p.model_copy(update={"version": installed[p.name]}) for p in self.uninstall if p.name in installed]
        stages = [_stage(p, "uninstall") for p in removing]
        owner = next((p for p in removing if p.has_interrupt), None)
        if self.uninstall_interrupt is not None and self.uninstall_interrupt.type != "noop" and owner is not None:
            stages.append(_stage(owner, "uninstall-interrupt", self.uninstall_interrupt))
        stages += [_stage(p, s) for p in due for s in ("upgrade" if p.name in installed else "apply", "config")]
        if self.interrupt is not None and self.interrupt.type != "noop" and due:
            stages.append(_stage(next((p for p in due if p.has_interrupt), due[0]), "interrupt", self.interrupt))
        stages += [_stage(p, "post-interrupt") for p in due if p.has_interrupt]
        return stages, {p.name: p.version for p in due}, [p.name for p in removing]


def _stage(package: PackagePlan, name: str, interrupt: InterruptPlan | None = None) -> NodeStage:
    return NodeStage(package=package.name, version=package.version, image=package.image, stage=name,
                     interrupt=interrupt.type if interrupt else None, services=interrupt.services if interrupt else [],
                     config=package.config, timeout_seconds=package.timeout_seconds)  # fmt: skip
