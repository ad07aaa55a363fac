"""MIG layouts: mig-parted's built-in config names, the profile table per GPU model, and what a layout makes a
node advertise (pure; docs/gpu-partitioning.md cites the sources).

The names are the GPU operator's built-in configs (`all-disabled`, `all-enabled`, `all-<profile>`, `all-balanced`;
a `+me` profile's config and resource write `.me`). The device plugin's `mixed` strategy advertises one resource per
profile, `nvidia.com/mig-<profile>`, and whole GPUs as `nvidia.com/gpu` only where MIG is off. A layout's capacity in
GPUs counts each instance by its compute slices out of the GPU's seven, the unit a GPU quota is compared in.
"""

from __future__ import annotations

from dataclasses import dataclass

from activities.kube.drain import GPU_RESOURCE, MIG_RESOURCE_PREFIX

SLICES = 7  # compute slices of every MIG-capable GPU in the table


@dataclass(frozen=True)
class GpuModel:
    """One row of the profile table: each single-profile layout's instances per GPU, and `all-balanced`."""

    name: str
    profiles: dict[str, int]
    balanced: dict[str, int]


MODELS = (
    GpuModel("A100-40GB",
             {"1g.5gb": 7, "1g.5gb+me": 1, "1g.10gb": 4, "2g.10gb": 3, "3g.20gb": 2, "4g.20gb": 1, "7g.40gb": 1},
             {"1g.5gb": 2, "2g.10gb": 1, "3g.20gb": 1}),
    GpuModel("A100-80GB/H100-80GB",
             {"1g.10gb": 7, "1g.10gb+me": 1, "1g.20gb": 4, "2g.20gb": 3, "3g.40gb": 2, "4g.40gb": 1, "7g.80gb": 1},
             {"1g.10gb": 2, "2g.20gb": 1, "3g.40gb": 1}),
    GpuModel("H200-141GB",
             {"1g.18gb": 7, "1g.18gb+me": 1, "1g.35gb": 4, "2g.35gb": 3, "3g.71gb": 2, "4g.71gb": 1, "7g.141gb": 1},
             {"1g.18gb": 2, "2g.35gb": 1, "3g.71gb": 1}),
)  # fmt: skip


@dataclass(frozen=True)
class Layout:
    """What a config makes of one GPU: MIG on or off, and its instances by profile."""

    mig_enabled: bool
    instances: dict[str, int]

    def resources(self, gpus: int) -> dict[str, int]:
        """The extended resources a node with `gpus` such GPUs advertises under the `mixed` strategy."""
        if not self.mig_enabled:
            return {GPU_RESOURCE: gpus}
        return {resource_name(p): n * gpus for p, n in self.instances.items()}

    def gpu_equivalents(self, gpus: int) -> float:
        """Capacity in GPUs: each instance counts its compute slices out of seven (`3g` is 3/7 of a GPU)."""
        if not self.mig_enabled:
            return float(gpus)
        return gpus * sum(n * compute_slices(p) for p, n in self.instances.items()) / SLICES


def resource_name(profile: str) -> str:
    return MIG_RESOURCE_PREFIX + profile.replace("+", ".")


def compute_slices(profile: str) -> int:
    return int(profile.split("g.", 1)[0])


def config_name(profile: str) -> str:
    return "all-" + profile.replace("+", ".")


def model_of(product: str) -> GpuModel | None:
    """The table's row for a GPU product as GFD labels it (`NVIDIA-H100-80GB-HBM3`, `NVIDIA-A100-SXM4-40GB`,
    `NVIDIA-H200`, with `-MIG-<profile>` under the `single` strategy); None when the table has no row for it."""
    name = product.upper().split("-MIG-", 1)[0]
    if "H200" in name:
        return MODELS[2]
    if ("A100" in name or "H100" in name) and "80GB" in name:
        return MODELS[1]
    if "A100" in name and "40GB" in name:
        return MODELS[0]
    return None


def known_configs() -> list[str]:
    """Every built-in config name some GPU model in the table has."""
    names = {"all-disabled", "all-enabled", "all-balanced"}
    names.update(config_name(p) for m in MODELS for p in m.profiles)
    return sorted(names)


def layout_of(config: str, model: GpuModel) -> Layout | None:
    """The layout `config` gives one GPU of `model`; None when that model has no such config."""
    if config == "all-disabled":
        return Layout(False, {})
    if config == "all-enabled":
        return Layout(True, {})
    if config == "all-balanced":
        return Layout(True, dict(model.balanced))
    for profile, count in model.profiles.items():
        if config == config_name(profile):
            return Layout(True, {profile: count})
    return None


def current_equivalents(resources: dict[str, int]) -> float:
    """Capacity in GPUs of what a node advertises now (`advertised`'s counts)."""
    total = 0.0
    for name, count in resources.items():
        if name == GPU_RESOURCE:
            total += count
        else:
            total += count * compute_slices(name.removeprefix(MIG_RESOURCE_PREFIX)) / SLICES
    return total
