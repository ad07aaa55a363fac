"""NVIDIA MIG as the lab emulates it: mig-parted's built-in configs per GPU model (the GPU operator's default
ConfigMap), mig-manager's node labels, and what the device plugin and GPU feature discovery (GFD) advertise for a
layout under the `single` or `mixed` strategy (shared/reference/lifecycle-apis.md §2). Pure: the controller is
lab/k8s/controllers/migmanager.py."""

from __future__ import annotations

import contextlib
import json
import re
import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass

# mig-manager's protocol: the desired config name, and its progress (pending, rebooting, success, failed).
CONFIG_LABEL = "nvidia.com/mig.config"
STATE_LABEL = "nvidia.com/mig.config.state"
# mig-manager has no reason label (it only logs why it failed): the lab writes the reason on this annotation.
FAILURE_ANNOTATION = "lab.millwright.dev/mig.config.failure"
# The emulated hardware: GPU model, GPU count and the layout applied, kept on the node so a restart from a state file
# keeps it (JSON: {"product", "gpus", "applied", "observed"}).
HARDWARE_ANNOTATION = "lab.millwright.dev/mig-hardware"
STRATEGY_LABEL = "nvidia.com/mig.strategy"
CAPABLE_LABEL = "nvidia.com/mig.capable"
PRODUCT_LABEL = "nvidia.com/gpu.product"
COUNT_LABEL = "nvidia.com/gpu.count"
GPU = "nvidia.com/gpu"
MIG_RESOURCE_PREFIX = "nvidia.com/mig-"  # also the prefix of mixed-strategy GFD labels (nvidia.com/mig-1g.10gb.count)
STRATEGIES = ("single", "mixed")
DISABLED = "all-disabled"
# The audit entry's path of a change of the config label (lab/k8s/util.py `diff`).
CONFIG_CHANGE_PATH = ".metadata.labels." + CONFIG_LABEL


class MigConfigError(ValueError):
    """A config mig-parted refuses for this node: the reason mig-manager's run fails with."""


@dataclass(frozen=True)
class GpuModel:
    """One row of the built-in profile table: the most instances of each profile a GPU holds alone, and the
    `all-balanced` mix."""

    name: str
    profiles: dict[str, int]
    balanced: dict[str, int]


A100_40GB = GpuModel(
    "A100-40GB",
    {"1g.5gb": 7, "1g.5gb+me": 1, "1g.10gb": 4, "2g.10gb": 3, "3g.20gb": 2, "4g.20gb": 1, "7g.40gb": 1},
    {"1g.5gb": 2, "2g.10gb": 1, "3g.20gb": 1},
)
GPU_80GB = GpuModel(
    "A100-80GB/H100-80GB",
    {"1g.10gb": 7, "1g.10gb+me": 1, "1g.20gb": 4, "2g.20gb": 3, "3g.40gb": 2, "4g.40gb": 1, "7g.80gb": 1},
    {"1g.10gb": 2, "2g.20gb": 1, "3g.40gb": 1},
)
H200_141GB = GpuModel(
    "H200-141GB",
    {"1g.18gb": 7, "1g.18gb+me": 1, "1g.35gb": 4, "2g.35gb": 3, "3g.71gb": 2, "4g.71gb": 1, "7g.141gb": 1},
    {"1g.18gb": 2, "2g.35gb": 1, "3g.71gb": 1},
)


def base_product(product: str) -> str:
    """The GPU model of a `nvidia.com/gpu.product` value, without the `-MIG-<profile>` the single strategy adds."""
    return product.split("-MIG-", 1)[0]


def model_of(product: str) -> GpuModel | None:
    """The profile table of a GPU product as GFD names it (`NVIDIA-H100-80GB-HBM3`); None: not MIG-capable here."""
    p = base_product(product).upper()
    if "H200" in p:
        return H200_141GB
    if ("A100" in p or "H100" in p) and "80GB" in p:
        return GPU_80GB
    if "A100" in p and "40GB" in p:
        return A100_40GB
    return None


def layout(config: str, model: GpuModel | None, product: str) -> dict[str, int] | None:
    """MIG devices per GPU that a built-in config gives this model: None for MIG off, {} for MIG on without
    devices (`all-enabled`). Raises MigConfigError for an unknown name or a profile the model lacks."""
    if config == DISABLED:
        return None
    if not config.startswith("all-"):
        raise MigConfigError(f"unknown MIG config {config!r}: not one of the built-in configs")
    if model is None:
        raise MigConfigError(f"GPU {product or '(no nvidia.com/gpu.product)'} does not support MIG")
    if config == "all-enabled":
        return {}
    if config == "all-balanced":
        return dict(model.balanced)
    name = config.removeprefix("all-")
    profile = name.removesuffix(".me") + "+me" if name.endswith(".me") else name
    if profile not in model.profiles:
        raise MigConfigError(f"MIG config {config!r} has no entry for {model.name} GPUs ({product})")
    return {profile: model.profiles[profile]}


def hardware(node: dict) -> dict:
    """The node's emulated GPUs: {"product", "gpus", "applied", "observed"} (`applied`: the config the GPUs have;
    `observed`: the last config label value mig-manager acted on). Before its first reconfiguration, read from what
    the node was seeded with: MIG off, the GPU count its capacity shows."""
    md = node.get("metadata") or {}
    raw = (md.get("annotations") or {}).get(HARDWARE_ANNOTATION)
    if raw:
        try:
            hw = json.loads(raw)
            if isinstance(hw, dict) and isinstance(hw.get("gpus"), int):
                return hw
        except ValueError:
            pass
    labels = md.get("labels") or {}
    status = node.get("status") or {}
    try:
        gpus = int((status.get("capacity") or {}).get(GPU) or (status.get("allocatable") or {}).get(GPU) or 0)
    except (TypeError, ValueError):
        gpus = 0
    return {"product": base_product(labels.get(PRODUCT_LABEL, "")), "gpus": gpus, "applied": DISABLED,
            "observed": None}  # fmt: skip


def physical_gpus(node: dict) -> int:
    """Whole GPUs in the node, whatever its layout advertises."""
    return int(hardware(node)["gpus"])


def resource_name(profile: str) -> str:
    """The mixed strategy's resource of a profile: `+` becomes `.` (nvidia.com/mig-1g.10gb.me)."""
    return MIG_RESOURCE_PREFIX + profile.replace("+", ".")


def _gfd_product(product: str, profile: str) -> str:
    """GFD's `<model>-MIG-<profile>`: characters outside [A-Za-z0-9-_.] dropped."""
    return re.sub(r"[^A-Za-z0-9\-_.]", "", f"{product}-MIG-{profile}")


def _slices(profile: str) -> str:
    return profile.split("g.", 1)[0]


@dataclass(frozen=True)
class Advertised:
    """What a node shows for a layout: extended resources (capacity = allocatable) and GFD labels."""

    resources: dict[str, int]
    labels: dict[str, str]


def advertised(per_gpu: dict[str, int] | None, gpus: int, product: str, strategy: str, capable: bool) -> Advertised:
    """The device plugin's resources and GFD's labels for `per_gpu` devices on each of `gpus` GPUs."""
    labels = {STRATEGY_LABEL: strategy, CAPABLE_LABEL: str(capable).lower(), PRODUCT_LABEL: product,
              COUNT_LABEL: str(gpus)}  # fmt: skip
    if per_gpu is None:
        return Advertised({GPU: gpus}, labels)
    if strategy == "single":
        if len(per_gpu) != 1:  # several profiles, or MIG on with no devices: GFD calls it invalid, nothing served
            return Advertised({GPU: 0}, {**labels, PRODUCT_LABEL: f"{product}-MIG-INVALID", COUNT_LABEL: "0"})
        ((profile, n),) = per_gpu.items()
        return Advertised({GPU: gpus * n}, {**labels, PRODUCT_LABEL: _gfd_product(product, profile),
                          COUNT_LABEL: str(gpus * n), "nvidia.com/gpu.replicas": "1",
                          "nvidia.com/gpu.slices.gi": _slices(profile),
                          "nvidia.com/gpu.slices.ci": _slices(profile)})  # fmt: skip
    resources = {GPU: 0}
    for profile, n in sorted(per_gpu.items()):
        res = resource_name(profile)
        resources[res] = gpus * n
        labels.update({f"{res}.count": str(gpus * n), f"{res}.product": _gfd_product(product, profile),
                       f"{res}.replicas": "1", f"{res}.slices.gi": _slices(profile),
                       f"{res}.slices.ci": _slices(profile)})  # fmt: skip
    return Advertised(resources, labels)


@dataclass(frozen=True)
class Device:
    """A device the device plugin serves and dcgm-exporter watches: a whole GPU (`profile` None) or a GPU instance
    of a MIG-enabled GPU (`instance`: the lab numbers them from 1 per GPU in layout order)."""

    gpu: int
    resource: str
    profile: str | None = None
    instance: int | None = None


def devices(node: dict, strategy: str) -> list[Device]:
    """The node's devices under the layout its GPUs have now (a MIG GPU without instances has none)."""
    hw = hardware(node)
    try:
        per_gpu = layout(str(hw["applied"]), model_of(hw["product"]), hw["product"])
    except MigConfigError:
        per_gpu = None
    if per_gpu is None:
        return [Device(gpu, GPU) for gpu in range(hw["gpus"])]
    out = []
    for gpu in range(hw["gpus"]):
        instances = [p for p, n in sorted(per_gpu.items()) for _ in range(n)]
        out += [Device(gpu, GPU if strategy == "single" else resource_name(p), p, i + 1) for i, p in
                enumerate(instances)]  # fmt: skip
    return out


DRA_DRIVER = "gpu.nvidia.com"  # NVIDIA's DRA driver (k8s-dra-driver-gpu)
MEMORY_SLICES = 8  # every GPU of the profile table has 8 memory slices (7 compute)


def _instance_shape(profile: str, model: GpuModel) -> tuple[int, int, range]:
    """A GPU instance profile's NVML id, its size in memory slices and where it may start (MIG User Guide)."""
    slices = int(_slices(profile))
    if profile.endswith("+me"):
        return 20, 1, range(0, 7)
    if slices == 1:
        return (19, 1, range(0, 7)) if model.profiles[profile] == 7 else (15, 2, range(0, 8, 2))
    return {2: (14, 2, range(0, 6, 2)), 3: (9, 4, range(0, 8, 4)), 4: (5, 4, range(0, 1)),
            7: (0, 8, range(0, 1))}[slices]  # fmt: skip


def placements(per_gpu: dict[str, int], model: GpuModel) -> list[tuple[str, int, int, int]]:
    """Where each instance of a GPU's layout sits: (profile, NVML profile id, start, size), largest first, each at
    the highest start left free (which fits every built-in layout)."""
    taken: set[int] = set()
    out = []
    for profile in sorted(per_gpu, key=lambda p: (-_instance_shape(p, model)[1], p)):
        gi, size, starts = _instance_shape(profile, model)
        for _ in range(per_gpu[profile]):
            start = next(s for s in reversed(starts) if not taken & set(range(s, s + size)))
            taken |= set(range(start, start + size))
            out.append((profile, gi, start, size))
    return out


def dra_devices(per_gpu: dict[str, int] | None, model: GpuModel | None, gpus: int, product: str,
                gpu_uuid: Callable[[int], str]) -> list[dict]:  # fmt: skip
    """The devices NVIDIA's DRA driver publishes in the node's ResourceSlice (resource.k8s.io/v1beta1): whole GPUs
    `gpu-<i>`, or the MIG devices `gpu-<i>-mig-<profile id>-<start>-<size>` of MIG-enabled ones."""
    name = {"productName": {"string": product.replace("-", " ")}}
    if per_gpu is None or model is None:
        return [{"name": f"gpu-{i}", "basic": {"attributes": {"type": {"string": "gpu"},
                 "uuid": {"string": gpu_uuid(i)}, **name}}} for i in range(gpus)]  # fmt: skip
    out = []
    for i in range(gpus):
        for profile, gi, start, size in placements(per_gpu, model):
            dev = f"gpu-{i}-mig-{gi}-{start}-{size}"
            attrs = {"type": {"string": "mig"}, "profile": {"string": profile}, "parentUUID": {"string": gpu_uuid(i)},
                     "uuid": {"string": f"MIG-{uuid.uuid5(uuid.NAMESPACE_URL, f'{gpu_uuid(i)}/{dev}')}"},
                     **name}  # fmt: skip
            capacity = {f"memorySlice{j}": {"value": "1"} for j in range(start, start + size)}
            out.append({"name": dev, "basic": {"attributes": attrs, "capacity": capacity}})
    return out


def is_gfd_label(key: str) -> bool:
    """A label `advertised` may write (so a stale one from the previous layout is removed)."""
    return key.startswith(MIG_RESOURCE_PREFIX) or key in (
        STRATEGY_LABEL, CAPABLE_LABEL, PRODUCT_LABEL, COUNT_LABEL, "nvidia.com/gpu.replicas",
        "nvidia.com/gpu.slices.gi", "nvidia.com/gpu.slices.ci",
    )  # fmt: skip


def is_gpu_resource(name: str) -> bool:
    return name == GPU or name.startswith(MIG_RESOURCE_PREFIX)


def gpu_resources(pod: dict) -> dict[str, float]:
    """What a pod asks of the device plugin: `nvidia.com/gpu` and `nvidia.com/mig-*`, summed over its containers
    (limits, else requests, as extended resources are set)."""
    out: dict[str, float] = {}
    for c in (pod.get("spec") or {}).get("containers") or []:
        res = c.get("resources") or {}
        asked = {**(res.get("requests") or {}), **(res.get("limits") or {})}
        for name, v in asked.items():
            if not is_gpu_resource(name):
                continue
            with contextlib.suppress(TypeError, ValueError):
                out[name] = out.get(name, 0.0) + float(v)
    return {k: v for k, v in out.items() if v}


def uses_gpus(pod: dict) -> bool:
    return bool(gpu_resources(pod))


def config_changes(audit: Iterable[dict]) -> list[dict]:
    """The audit entries that changed a node's config label, oldest first: {"seq", "node", "from", "to",
    "gpuPods", "userAgent"}; `gpuPods` lists the unfinished pods using GPUs on the node at that moment."""
    return [
        {"seq": e.get("seq"), "node": e.get("name"), "userAgent": e.get("userAgent"), **e["migConfigChange"]}
        for e in audit
        if e.get("migConfigChange")
    ]
