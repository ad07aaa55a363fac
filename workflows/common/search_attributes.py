"""Millwright's custom search attributes, defined once.

The lab registers them on its dev server; production namespaces need them
registered once (see deploy/README.md, "Temporal server side").
"""

from temporalio.common import SearchAttributeKey

CLUSTER = SearchAttributeKey.for_keyword("MillwrightCluster")
NODE = SearchAttributeKey.for_keyword("MillwrightNode")
TENANT = SearchAttributeKey.for_keyword("MillwrightTenant")
PHASE = SearchAttributeKey.for_keyword("MillwrightPhase")

ALL = [CLUSTER, NODE, TENANT, PHASE]
