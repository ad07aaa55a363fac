"""Every external system the worker reaches, in the order its start-up log names them: the one list the worker
builds its activities from (worker/registry.py), logs (worker/main.py) and reads its settings for (worker/config.py).

A new system: its package's ``integration.py`` (activities/support/integration.py says what one holds), a line in
`INTEGRATIONS` and its settings among `IntegrationSettings`' bases (tests/test_architecture.py checks the two agree
and that every system with activities has its integration)."""

from __future__ import annotations

from typing import Any

from activities.entities import Entities
from activities.firmware.integration import Bmcs, BmcSettings
from activities.ironic.integration import Ironic, IronicSettings
from activities.kube.integration import Kubernetes, KubernetesSettings
from activities.netbox.integration import NetBox, NetBoxSettings
from activities.notify import Notify
from activities.prometheus import Prometheus, PrometheusSettings
from activities.support.integration import Integration
from activities.ufm.integration import Ufm, UfmSettings
from activities.usage_report import UsageReports, UsageReportSettings

INTEGRATIONS: tuple[Integration[Any], ...] = (
    Kubernetes(),
    NetBox(),
    Ufm(),
    Ironic(),
    Bmcs(),
    Prometheus(),
    Notify(),
    Entities(),
    UsageReports(),
)


class IntegrationSettings(
    KubernetesSettings,
    NetBoxSettings,
    UfmSettings,
    IronicSettings,
    BmcSettings,
    PrometheusSettings,
    UsageReportSettings,
):
    """The settings of every integration, as one model the worker's settings extend (named bases, not computed from
    the list, so the type checker knows each field)."""
