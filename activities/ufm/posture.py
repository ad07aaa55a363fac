"""What makes PKey isolation hold on a fabric, or not: the findings for what UFM reports.

The management PKey 0x7fff's default membership (UFM reports it from 6.19; ``full``, UFM's default, lets every port
reach every other whatever the tenants' PKeys say) and the SM's keys (``GET /app/smconf``: M_Key, SM_Key, SA_Key,
M_Key per port). Only findings leave, never a key's value. The activity that reads them is
`UfmActivities.fabric_posture` (activities/ufm/activities.py).
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field

from activities.models import StrictModel
from activities.ufm.models import Membership

PostureCode = Literal["default-membership-full", "default-membership-unreported", "m-key-unset",
                      "m-key-per-port-off", "sm-key-default", "sa-key-default", "sm-config-unreadable"]  # fmt: skip
BlockingCode = Literal["default-membership-full", "default-membership-unreported"]


class PostureFinding(StrictModel):
    code: PostureCode
    blocking: bool = Field(description="Voids PKey isolation or leaves it unverifiable: IsolateTenant refuses.")
    detail: str
    remedy: str

    def line(self) -> str:
        return f"{self.code}: {self.detail}. Remedy: {self.remedy}"


class FabricPosture(StrictModel):
    """What makes PKey isolation on this fabric hold: facts and findings, never a key's value."""

    ufm_version: str
    default_membership: Membership | None = Field(description="0x7fff's default membership; None: not reported.")
    m_key_set: bool | None = None
    m_key_per_port: bool | None = None
    sm_key_default: bool | None = None
    sa_key_default: bool | None = None
    findings: list[PostureFinding] = Field(default_factory=list)

    def blocking(self) -> list[PostureFinding]:
        return [f for f in self.findings if f.blocking]

    def warnings(self) -> list[PostureFinding]:
        return [f for f in self.findings if not f.blocking]


_GV_CFG = "/opt/ufm/files/conf/gv.cfg"
_OPENSM_CONF = "/opt/ufm/files/conf/opensm/opensm.conf"


def assess_posture(release: str, default_membership: Any, smconf: dict | None, smconf_error: str = "") -> FabricPosture:
    """The findings for what UFM reported: 0x7fff's default membership (None: not reported) and the SM settings."""
    membership = default_membership if default_membership in ("full", "limited") else None
    findings: list[PostureFinding] = []
    if membership == "full":
        findings.append(PostureFinding(
            code="default-membership-full", blocking=True,
            detail="every port is a full member of the management PKey 0x7fff, so any two ports reach each other "
                   "through it whatever the tenants' PKeys say",
            remedy=f"set default_membership = limited in {_GV_CFG} and restart UFM (on a UFM-SDN appliance: "
                   "ib partition management defmember limited)",
        ))  # fmt: skip
    elif membership is None:
        findings.append(PostureFinding(
            code="default-membership-unreported", blocking=True,
            detail=f"UFM {release} does not report the management PKey 0x7fff's default membership (UFM reports it "
                   "from 6.19), so the isolation cannot be verified",
            remedy=f"upgrade UFM to 6.19 or later; or, having set default_membership = limited in {_GV_CFG}, accept "
                   "this finding (IsolateTenant accept_posture: [\"default-membership-unreported\"])",
        ))  # fmt: skip
    keys: dict[str, Any] = {}
    if smconf is None:
        findings.append(
            PostureFinding(
                code="sm-config-unreadable",
                blocking=False,
                detail=f"the SM keys were not checked: {smconf_error}",
                remedy="let the UFM user Millwright uses read /ufmRest/app/smconf",
            )
        )
    else:
        keys = {
            "m_key_set": _key(smconf.get("m_key")) not in (None, 0),
            "m_key_per_port": _flag(smconf.get("m_key_per_port")),
            "sm_key_default": _key(smconf.get("sm_key")) == 1,
            "sa_key_default": _key(smconf.get("sa_key")) == 1,
        }
        if not keys["m_key_set"]:
            findings.append(PostureFinding(
                code="m-key-unset", blocking=False,
                detail="the M_Key is 0x0: a host's root user can reconfigure ports (PortInfo, PKey tables) with SMPs",
                remedy=f"set m_key_per_port = true in {_GV_CFG} and m_key_protection_level 2 in {_OPENSM_CONF}, then "
                       "restart UFM",
            ))  # fmt: skip
        if not keys["m_key_per_port"]:
            findings.append(
                PostureFinding(
                    code="m-key-per-port-off",
                    blocking=False,
                    detail="one M_Key serves every port (m_key_per_port is off)",
                    remedy=f"set m_key_per_port = true in {_GV_CFG} and restart UFM",
                )
            )
        if keys["sm_key_default"]:
            findings.append(
                PostureFinding(
                    code="sm-key-default",
                    blocking=False,
                    detail="the SM_Key is UFM's default 0x1",
                    remedy=f"set sm_key to a random 64-bit value in {_OPENSM_CONF}",
                )
            )
        if keys["sa_key_default"]:
            findings.append(
                PostureFinding(
                    code="sa-key-default",
                    blocking=False,
                    detail="the SA_Key is UFM's default 0x1",
                    remedy=f"set randomize_sa_key = true in {_GV_CFG}",
                )
            )
    return FabricPosture(ufm_version=release, default_membership=membership, findings=findings, **keys)


def _key(value: Any) -> int | None:
    """A key as UFM reports it (``"0x0"``, ``"0x0000000000000001"``, a number); None when absent or unreadable."""
    if isinstance(value, bool) or value is None:
        return None
    if isinstance(value, int):
        return value
    try:
        return int(str(value).strip(), 0)
    except ValueError:
        return None


def _flag(value: Any) -> bool:
    return value is True or str(value).strip().lower() in ("true", "1", "yes")
