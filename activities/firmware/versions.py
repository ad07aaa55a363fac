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
