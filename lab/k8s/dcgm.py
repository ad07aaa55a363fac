"""What the lab's Prometheus scrapes from the emulator: NVIDIA dcgm-exporter per GPU node and KAI's queue metrics,
made from the emulator's own Nodes, Pods and Queues at each scrape.

* ``GET /_lab/dcgm/targets``: Prometheus HTTP service discovery, one target per GPU node (a node with
  ``nvidia.com/gpu`` capacity, or MIG-partitioned GPUs: lab/k8s/mig.py), as a dcgm-exporter DaemonSet has one pod per GPU node;
* ``GET /_lab/dcgm/nodes/<node>/metrics``: that node's exporter, in dcgm-exporter's text format and label set
  (``gpu``, ``UUID``, ``pci_bus_id``, ``device``, ``modelName``, ``Hostname``, ``DCGM_FI_DRIVER_VERSION``; and
  ``pod``/``namespace``/``container`` on a GPU allocated to a pod, as ``-k`` maps them). A bound, unfinished pod
  holds as many GPUs as its containers ask ``nvidia.com/gpu`` for, given out in pod-name order from GPU 0. A
  MIG-enabled GPU shows one series per GPU instance instead (its parent's labels plus ``GPU_I_PROFILE`` and
  ``GPU_I_ID``, as ``-d f`` watches them), held by the pods asking for its resource (lab/k8s/mig.py `devices`);
* ``GET /_lab/kai/metrics``: KAI's queue-controller gauges per Queue (``queue_name``): ``kai_queue_info``,
  ``kai_queue_deserved_gpus`` (``spec.resources.gpu.quota``), ``kai_queue_allocated_gpus`` (the GPUs of the
  unfinished pods labelled ``kai.scheduler/queue: <queue>``, or in a namespace so labelled);
* ``POST /_lab/dcgm {"node": "n1", "gpu": 3, "values": {"DCGM_FI_DEV_GPU_TEMP": 91}}``: set a reading (``gpu``
  left out: every GPU of the node that has no reading of its own; a value ``null``: back to the default); ``GET /_lab/dcgm`` lists what is set.
  `/_lab/reset` forgets them.

Every GPU reads idle and healthy unless a test set otherwise (`DEFAULTS`).
"""

from __future__ import annotations

import json
import uuid
from typing import Any

from aiohttp import web

from . import mig
from .controllers.pods import gpu_request, is_active
from .crds import QUEUES
from .store import NAMESPACES, NODES, PODS, Store
from .util import ApiError, jresp

QUEUE_LABEL = "kai.scheduler/queue"
DRIVER_VERSION = "550.54.15"
FB_TOTAL_MIB = 81_559  # an 80 GB board as NVML counts it

# dcgm-exporter's default counters (and the fault fields the sweep enables), with their type and help text as its
# counters CSV gives them, and the reading a healthy idle GPU shows.
COUNTERS: dict[str, tuple[str, str, float]] = {
    "DCGM_FI_DEV_SM_CLOCK": ("gauge", "SM clock frequency (in MHz).", 1980),
    "DCGM_FI_DEV_MEM_CLOCK": ("gauge", "Memory clock frequency (in MHz).", 2619),
    "DCGM_FI_DEV_GPU_TEMP": ("gauge", "GPU temperature (in C).", 34),
    "DCGM_FI_DEV_MEMORY_TEMP": ("gauge", "Memory temperature (in C).", 31),
    "DCGM_FI_DEV_POWER_USAGE": ("gauge", "Power draw (in W).", 72),
    "DCGM_FI_DEV_GPU_UTIL": ("gauge", "GPU utilization (in %).", 0),
    "DCGM_FI_DEV_MEM_COPY_UTIL": ("gauge", "Memory utilization (in %).", 0),
    "DCGM_FI_DEV_FB_FREE": ("gauge", "Framebuffer memory free (in MiB).", FB_TOTAL_MIB),
    "DCGM_FI_DEV_FB_USED": ("gauge", "Framebuffer memory used (in MiB).", 0),
    "DCGM_FI_DEV_XID_ERRORS": ("gauge", "Value of the last XID error encountered.", 0),
    "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL": ("counter", "Total number of double-bit volatile ECC errors.", 0),
    "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS": ("counter", "Number of remapped rows for uncorrectable errors", 0),
    "DCGM_FI_DEV_ROW_REMAP_FAILURE": ("gauge", "Whether remapping of rows has failed", 0),
    "DCGM_FI_DEV_ROW_REMAP_PENDING": ("gauge", "Whether remapping of rows is pending", 0),
}


def gpu_uuid(node: str, gpu: int) -> str:
    """A stable UUID per node and GPU index, in NVML's `GPU-` form."""
    return f"GPU-{uuid.uuid5(uuid.NAMESPACE_DNS, f'{node}/{gpu}')}"


def _gpu_count(node: dict) -> int:
    """Whole GPUs, MIG-partitioned or not (a partitioned node advertises no `nvidia.com/gpu` under `mixed`)."""
    return mig.physical_gpus(node)


def _quote(value: str) -> str:
    return '"' + value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"') + '"'


def _number(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else repr(float(value))


def _allocations(store: Store, node: str, devices: list[mig.Device]) -> list[dict[str, str]]:
    """Per device, the pod labels of the pod holding it: pods in name order take the first free devices of each
    resource they ask for (`nvidia.com/gpu`, `nvidia.com/mig-*`)."""
    out: list[dict[str, str]] = [{} for _ in devices]
    pods_rt = store.registry.types[PODS]
    for ns, name in sorted(store.pods_by_node.get(node, ())):
        pod = store.get(pods_rt, ns, name)
        if pod is None or not is_active(pod):
            continue
        container = ((pod.get("spec") or {}).get("containers") or [{}])[0].get("name", "")
        for resource, n in sorted(mig.gpu_resources(pod).items()):
            free = [i for i, d in enumerate(devices) if d.resource == resource and not out[i]]
            for i in free[: int(n)]:
                out[i] = {"pod": name, "namespace": ns, "container": container}
    return out


def node_metrics(store: Store, node_name: str) -> str:
    node = store.get(store.registry.types[NODES], None, node_name)
    if node is None:
        raise ApiError(404, f"no node {node_name!r}", "NotFound")
    devices = mig.devices(node, str(store.config["migStrategy"]))
    product = mig.base_product((node["metadata"].get("labels") or {}).get(mig.PRODUCT_LABEL) or "NVIDIA H200")
    model = product.replace("-", " ")
    held = _allocations(store, node_name, devices)
    readings = store.gpu_readings.get(node_name, {})
    lines: list[str] = []
    for metric, (kind, help_text, default) in COUNTERS.items():
        lines += [f"# HELP {metric} {help_text}", f"# TYPE {metric} {kind}"]
        for d, pod in zip(devices, held):
            gpu = d.gpu
            labels = {"gpu": str(gpu), "UUID": gpu_uuid(node_name, gpu), "pci_bus_id": f"00000000:{0x18 + gpu:02X}:00.0",
                      "device": f"nvidia{gpu}", "modelName": model}  # fmt: skip
            if d.profile is not None:  # a GPU instance: its parent's labels and its own
                labels.update(GPU_I_PROFILE=d.profile, GPU_I_ID=str(d.instance))
            labels.update(Hostname=node_name, DCGM_FI_DRIVER_VERSION=DRIVER_VERSION, **pod)
            value = readings.get(gpu, {}).get(metric, readings.get(None, {}).get(metric, default))
            body = ",".join(f"{k}={_quote(v)}" for k, v in labels.items())
            lines.append(f"{metric}{{{body}}} {_number(value)}")
    return "\n".join(lines) + "\n"


def targets(store: Store, host: str) -> list[dict]:
    """HTTP service discovery: one dcgm-exporter target per GPU node."""
    out = []
    for node in store.all(NODES):
        name = node["metadata"]["name"]
        if _gpu_count(node):
            out.append({"targets": [host], "labels": {"__metrics_path__": f"/_lab/dcgm/nodes/{name}/metrics",
                                                      "node": name}})  # fmt: skip
    return out


def kai_metrics(store: Store) -> str:
    ns_rt = store.registry.types[NAMESPACES]
    allocated: dict[str, float] = {}
    for pod in store.all(PODS):
        if not pod.get("spec", {}).get("nodeName") or not is_active(pod):
            continue
        md = pod["metadata"]
        queue = (md.get("labels") or {}).get(QUEUE_LABEL)
        if queue is None:
            ns = store.get(ns_rt, None, md["namespace"]) or {}
            queue = ((ns.get("metadata") or {}).get("labels") or {}).get(QUEUE_LABEL)
        if queue:
            allocated[queue] = allocated.get(queue, 0.0) + gpu_request(pod)
    rows: dict[str, list[str]] = {"kai_queue_info": [], "kai_queue_deserved_gpus": [], "kai_queue_allocated_gpus": []}
    for queue in store.all(QUEUES) if store.registry.types.get(QUEUES) else []:
        name = queue["metadata"]["name"]
        quota = (((queue.get("spec") or {}).get("resources") or {}).get("gpu") or {}).get("quota", 0)
        label = f"{{queue_name={_quote(name)}}}"
        rows["kai_queue_info"].append(f"kai_queue_info{label} 1")
        rows["kai_queue_deserved_gpus"].append(f"kai_queue_deserved_gpus{label} {_number(max(float(quota), 0))}")
        rows["kai_queue_allocated_gpus"].append(f"kai_queue_allocated_gpus{label} {_number(allocated.get(name, 0))}")
    lines = []
    for metric, samples in rows.items():
        lines += [f"# HELP {metric} KAI queue {metric.removeprefix('kai_queue_').replace('_', ' ')}",
                  f"# TYPE {metric} gauge", *samples]  # fmt: skip
    return "\n".join(lines) + "\n"


def set_readings(store: Store, body: Any) -> dict:
    if not isinstance(body, dict) or not isinstance(body.get("node"), str) or not isinstance(body.get("values"), dict):
        raise ApiError(400, 'expected {"node": "...", "gpu": 0 (optional), "values": {"DCGM_FI_...": 1}}', "BadRequest")
    unknown = sorted(set(body["values"]) - set(COUNTERS))
    if unknown:
        raise ApiError(400, f"unknown dcgm-exporter fields {unknown}; known: {sorted(COUNTERS)}", "BadRequest")
    # Readings under the GPU `None` are the node's (every GPU's unless one has its own).
    gpu = int(body["gpu"]) if body.get("gpu") is not None else None
    values = store.gpu_readings.setdefault(body["node"], {}).setdefault(gpu, {})
    for metric, value in body["values"].items():
        if value is None:
            values.pop(metric, None)
        else:
            values[metric] = float(value)
    return {"ok": True}


async def handle(store: Store, request: web.Request, path: str) -> web.Response | None:
    """The routes above, or None for another admin path."""
    if path == "/_lab/dcgm/targets":
        async with store.lock:
            return jresp(targets(store, request.host))
    if path.startswith("/_lab/dcgm/nodes/") and path.endswith("/metrics"):
        async with store.lock:
            text = node_metrics(store, path.removeprefix("/_lab/dcgm/nodes/").removesuffix("/metrics"))
        return web.Response(text=text, content_type="text/plain", charset="utf-8")
    if path == "/_lab/kai/metrics":
        async with store.lock:
            text = kai_metrics(store)
        return web.Response(text=text, content_type="text/plain", charset="utf-8")
    if path == "/_lab/dcgm":
        if request.method == "POST":
            raw = await request.read()
            try:
                body = json.loads(raw) if raw else None
            except (json.JSONDecodeError, UnicodeDecodeError) as e:
                raise ApiError(400, f"error decoding request body: {e}", "BadRequest") from None
            async with store.lock:
                return jresp(set_readings(store, body))
        async with store.lock:
            return jresp({n: {"all" if g is None else str(g): v for g, v in per.items() if v}
                          for n, per in store.gpu_readings.items()})  # fmt: skip
    return None
