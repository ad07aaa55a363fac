"""NVIDIA's mig-manager on every GPU node, with the device plugin and GPU feature discovery it restarts.

A change of the node's `nvidia.com/mig.config` walks `nvidia.com/mig.config.state` through `pending` (for the
`migPendingSeconds` setting) → `rebooting` (when rebooting is on for the node and the MIG mode changes, as
WITH_REBOOT does; the node is NotReady for `rebootSeconds`) → `success` or `failed`. On success the kubelet
advertises the layout's resources and GFD relabels the node (lab/k8s/mig.py, strategy `migStrategy`); a config
already applied goes straight to `success`. Applying a layout fails the GPU pods still on the node, as a kubelet
restarted without their devices does. `failed` carries its reason on the FAILURE_ANNOTATION; an unknown config, a
profile the GPU lacks, or a failure set for the node (`migNodes`, `POST /_lab/mig`) fails before the GPUs are
touched. With `migDra` on, NVIDIA's DRA driver also publishes the node's devices as a ResourceSlice."""

from __future__ import annotations

import json

from .. import mig
from ..dcgm import gpu_uuid
from ..store import NODES, PODS, node_ready
from ..util import clone
from .base import Controller
from .pods import terminate
from .reboots import start_reboot

RESOURCE_SLICES = ("resource.k8s.io", "resourceslices")
POD_FAILURE_REASON = "UnexpectedAdmissionError"  # the kubelet's, when a running pod's devices are gone


class MigManager(Controller):
    def reconcile(self, work: set, now: float) -> None:
        for ok in sorted(ok for ok in work if ok[0] == NODES):
            node = self.store.lookup(ok)
            if node is not None:
                self.sync(node, now)

    def sync(self, node: dict, now: float) -> None:
        md = node["metadata"]
        want = (md.get("labels") or {}).get(mig.CONFIG_LABEL)
        side = self.store.side.setdefault(md.get("uid", ""), {})
        run = side.get("mig")
        hw = mig.hardware(node)
        if run is not None and run["phase"] == "rebooting":  # a reboot under way ends first, whatever the label
            if md["name"] not in self.store.rebooting and node_ready(node):
                self._finish(node, run)
            return
        if self._set_for(md["name"]).get("absent"):
            side.pop("mig", None)  # no mig-manager there: nothing acts on the label
            return
        if want is None or hw["gpus"] <= 0:
            side.pop("mig", None)
            if want is None and hw.get("observed") is not None:  # a label set again later is a new change
                hw["observed"] = None
                self._label(node, {}, "nvidia-mig-manager", {mig.HARDWARE_ANNOTATION: json.dumps(hw)})
            return
        if run is None or run["config"] != want:
            if run is None and hw["observed"] == want:
                return
            self._begin(node, hw, want, now)
            return
        if now < run["due"]:
            self.store.schedule_at(run["due"], (NODES, ("", md["name"])))
            return
        self._apply(node, hw, run, now)

    def _set_for(self, node_name: str) -> dict:
        """What a test set for the node (`migNodes`): fail, reboot, pendingSeconds, absent."""
        return (self.store.config.get("migNodes") or {}).get(node_name) or {}

    def _begin(self, node: dict, hw: dict, want: str, now: float) -> None:
        pending = self._set_for(node["metadata"]["name"]).get("pendingSeconds")
        pending = float(self.store.config["migPendingSeconds"] if pending is None else pending)
        due = now + pending
        run = {"config": want, "phase": "pending", "due": due}
        if want == hw["applied"]:  # mig-parted's assert passes: nothing to do
            self._finish(node, run)
            return
        self.store.side[node["metadata"].get("uid", "")]["mig"] = run
        self._label(node, {mig.STATE_LABEL: "pending"}, "nvidia-mig-manager")
        self.store.schedule_at(due, (NODES, ("", node["metadata"]["name"])))

    def _apply(self, node: dict, hw: dict, run: dict, now: float) -> None:
        name, cfg = node["metadata"]["name"], self.store.config
        override = self._set_for(name)
        try:
            per_gpu = mig.layout(run["config"], mig.model_of(hw["product"]), hw["product"])
        except mig.MigConfigError as e:
            self._finish(node, run, str(e))
            return
        reboot = override.get("reboot")
        reboot = bool(cfg["migReboot"] if reboot is None else reboot)
        mode_change = (per_gpu is None) != (hw["applied"] == mig.DISABLED)
        if override.get("fail") and not (reboot and mode_change):
            self._finish(node, run, str(override["fail"]))
            return
        self._fail_gpu_pods(name, run["config"])
        if reboot and mode_change:
            run["phase"] = "rebooting"
            self._label(node, {mig.STATE_LABEL: "rebooting"}, "nvidia-mig-manager")
            start_reboot(self.store, name, now)
            return
        self._finish(node, run)

    def _finish(self, node: dict, run: dict, failure: str | None = None) -> None:
        """The run ends: `success` with the layout advertised, or `failed` with `failure` (or the node's set
        failure, once it is back from a reboot)."""
        store, name = self.store, node["metadata"]["name"]
        store.side.get(node["metadata"].get("uid", ""), {}).pop("mig", None)
        hw = mig.hardware(node)
        if failure is None and run["phase"] == "rebooting":
            failure = self._set_for(name).get("fail")
        if failure:
            hw["observed"] = run["config"]
            self._label(node, {mig.STATE_LABEL: "failed"}, "nvidia-mig-manager",
                        {mig.FAILURE_ANNOTATION: str(failure), mig.HARDWARE_ANNOTATION: json.dumps(hw)})  # fmt: skip
            return
        model = mig.model_of(hw["product"])
        per_gpu = mig.layout(run["config"], model, hw["product"])
        shown = mig.advertised(per_gpu, hw["gpus"], hw["product"], str(store.config["migStrategy"]), model is not None)
        node = self._advertise(node, shown.resources)
        if store.config["migDra"]:
            self._publish_slice(node, hw, per_gpu, model)
        stale = {k: None for k in node["metadata"].get("labels") or {} if mig.is_gfd_label(k)}
        node = self._label(node, {**stale, **shown.labels}, "gpu-feature-discovery")
        hw.update(applied=run["config"], observed=run["config"])
        self._label(node, {mig.STATE_LABEL: "success"}, "nvidia-mig-manager",
                    {mig.FAILURE_ANNOTATION: None, mig.HARDWARE_ANNOTATION: json.dumps(hw)})  # fmt: skip

    def _advertise(self, node: dict, resources: dict[str, int]) -> dict:
        """The kubelet's node status once the device plugin registered the layout's resources."""
        new = clone(node)
        st = new.setdefault("status", {})
        for field in ("capacity", "allocatable"):
            have = {k: v for k, v in (st.get(field) or {}).items() if not mig.is_gpu_resource(k)}
            st[field] = {**have, **{k: str(v) for k, v in resources.items()}}
        if st == node.get("status"):
            return node
        return self.store.put(self.store.registry.types[NODES], new, actor="kubelet", verb="update",
                              subresource="status")  # fmt: skip

    def _publish_slice(self, node: dict, hw: dict, per_gpu: dict[str, int] | None, model: mig.GpuModel | None) -> None:
        """NVIDIA's DRA driver publishes the node's devices as one ResourceSlice, owned by the Node, its pool's
        generation moving on with each change."""
        store, md = self.store, node["metadata"]
        rt = store.registry.types[RESOURCE_SLICES]
        devices = mig.dra_devices(per_gpu, model, hw["gpus"], hw["product"], lambda i: gpu_uuid(md["name"], i))
        name = f"{md['name']}-{mig.DRA_DRIVER}"
        old = store.get(rt, None, name)
        generation = int((((old or {}).get("spec") or {}).get("pool") or {}).get("generation") or 0)
        if old is not None and old["spec"].get("devices") == devices:
            return
        obj = {"metadata": {"name": name, "ownerReferences": [{"apiVersion": "v1", "kind": "Node", "name": md["name"],
                                                                "uid": md.get("uid"), "controller": True}]},
               "spec": {"driver": mig.DRA_DRIVER, "nodeName": md["name"], "devices": devices,
                        "pool": {"name": md["name"], "generation": generation + 1, "resourceSliceCount": 1}}}  # fmt: skip
        if old is None:
            store.put(rt, store.new_meta(rt, obj), actor="gpu-kubelet-plugin", verb="create")
            return
        obj["metadata"] = {**clone(old["metadata"]), **obj["metadata"]}
        obj["metadata"]["generation"] = int(old["metadata"].get("generation") or 1) + 1
        store.put(rt, obj, actor="gpu-kubelet-plugin", verb="update")

    def _label(self, node: dict, labels: dict, actor: str, annotations: dict | None = None) -> dict:
        """Set (a value) or remove (None) labels and annotations in one node write, if any changes."""
        new = clone(node)
        md = new["metadata"]
        for field, changes in (("labels", labels), ("annotations", annotations or {})):
            have = md.setdefault(field, {})
            for k, v in changes.items():
                if v is None:
                    have.pop(k, None)
                else:
                    have[k] = v
        if md == node["metadata"]:
            return node
        return self.store.put(self.store.registry.types[NODES], new, actor=actor, verb="patch")

    def _fail_gpu_pods(self, node_name: str, config: str) -> None:
        store = self.store
        prt = store.registry.types[PODS]
        for ns, pod_name in sorted(store.pods_by_node.get(node_name, ())):
            pod = store.get(prt, ns, pod_name)
            if pod is None or (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed"):
                continue
            asked = mig.gpu_resources(pod)
            if not asked:
                continue
            res, n = sorted(asked.items())[0]
            new = clone(pod)
            new.setdefault("status", {}).update(
                reason=POD_FAILURE_REASON,
                message=f"Allocate failed due to requested number of devices unavailable for {res}. "
                f"Requested: {n:g}, Available: 0, which is unexpected",
            )
            terminate(store, new, False, f"lab: mig-manager applied {config} under the running container")
