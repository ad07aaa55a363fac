"""Ordering firmware versions, to tell a downgrade from an upgrade.

Vendors write firmware versions as dotted parts, not semantic versions: ``24.09``, ``1.8.2``, ``0.2.1.9``, GPU VBIOS
``96.00.A5.00.01`` (hexadecimal parts). Parts are compared one by one: decimal against decimal numerically,
otherwise hexadecimal against hexadecimal numerically, otherwise as text; a version that runs out of parts first is
the lower one (``1.8`` < ``1.8.1``).
"""

from __future__ import annotations

import re

_SEPARATORS = re.compile(r"[.\-_ ]+")
_HEX = re.compile(r"^[0-9A-Fa-f]+$")


def _key(part: str) -> tuple[int, int, str]:
    if part.isdigit():
        return 0, int(part), ""
    if _HEX.match(part):
        return 0, int(part, 16), ""
    return 1, 0, part


def is_downgrade(installed: str, wanted: str) -> bool:
    """`wanted` orders below `installed`."""
    have = [_key(p) for p in _SEPARATORS.split(installed.strip()) if p]
    want = [_key(p) for p in _SEPARATORS.split(wanted.strip()) if p]
    return want < have


def refused(targets: list[str], version: str, inventory: dict[str, str], allow_downgrade: bool) -> tuple[str, str]:
    """Why installing `version` on `targets` is refused, from the firmware `inventory` alone: (error type, reason),
    or ("", "") when it is not. The workflow asks before it takes the node out, the activity again before it
    writes."""
    unknown = [t for t in targets if t not in inventory]
    if unknown:
        return "FirmwareComponentUnknown", (f"no firmware inventory entry {', '.join(unknown)} (it has "
                                            f"{', '.join(sorted(inventory)[:20])})")  # fmt: skip
    older = {t: inventory[t] for t in targets if is_downgrade(inventory[t], version)}
    if older and not allow_downgrade:
        return "FirmwareDowngradeRefused", (f"{version} is older than the installed "
                                            + ", ".join(f"{t} {v}" for t, v in older.items())
                                            + "; set allow_downgrade to install it")  # fmt: skip
    return "", ""
