"""The rollout spec: NodeWright's names, Millwright's safe defaults, every bad input rejected
with its field path in the message.

Longer than 600 lines because every section of the spec (workflows/rollout/spec/spec.py and the modules it names) has
its accepted and refused inputs here, all built from one valid spec (`spec`, `pkg`, `policy`) by small changes."""

from __future__ import annotations

import copy
from datetime import timedelta

import pytest
from pydantic import ValidationError

from activities.kube.models import DrainSettings
from activities.support.selectors import parse_label_selector, selector_matches
from workflows.common import search_attributes as sa
from workflows.rollout.dependency_graph import DependencyCycle, dependency_levels, topological_order
from workflows.rollout.spec.admission import MaintenanceWindow
from workflows.rollout.spec.drain_config import DrainConfig
from workflows.rollout.spec.label_selector import LabelSelector
from workflows.rollout.spec.packages import Interrupt
from workflows.rollout.spec.spec import RolloutInput, describe_errors

# Appendix A of the NodeWright reference, as a Millwright rollout.
APPENDIX_A = {
    "cluster": "lab",
    "name": "gpu-driver",
    "nodeSelectors": {"matchLabels": {"nvidia.com/gpu.present": "true"}},
    "podNonInterruptLabels": {"matchLabels": {"workload": "training"}},
    "drainConfig": {"timeout": "10m", "gracePeriod": "30s"},
    "packages": {
        "gpu-driver": {
            "version": "1.0.0",
            "image": "example/gpu-driver",
            "stageTimeout": "30m",
            "interrupt": {"type": "reboot"},
        }
    },
}


def spec(**changes) -> dict:
    data = copy.deepcopy(APPENDIX_A)
    data.update(changes)
    return data


def pkg(**changes) -> dict:
    data = {"version": "1.0.0", "image": "example/thing"}
    data.update(changes)
    return data


def rejected(data: dict, *fragments: str) -> str:
    """Validation fails and every fragment (a field path, a reason) appears in the message."""
    with pytest.raises(ValidationError) as info:
        RolloutInput.model_validate(data)
    text = str(info.value)
    lines = "\n".join(describe_errors(info.value))
    for fragment in fragments:
        assert fragment in text, f"{fragment!r} not in:\n{text}"
        assert fragment in lines, f"{fragment!r} not in:\n{lines}"
    return lines


def policy(**changes) -> dict:
    data = {"default": {"budget": {"percent": 100}, "strategy": {"fixed": {}}}}
    data.update(changes)
    return data


def compartment(name="prod", selector=None, budget=None, strategy=None) -> dict:
    c = {
        "name": name,
        "selector": {"matchLabels": {"env": name}} if selector is None else selector,
        "budget": {"count": 1} if budget is None else budget,
    }
    if strategy is not None:
        c["strategy"] = strategy
    return c


# ---------------------------------------------------------------- accepted specs


def test_appendix_a_parses_with_nodewright_names():
    r = RolloutInput.model_validate(APPENDIX_A)
    assert r.node_selectors.match_labels == {"nvidia.com/gpu.present": "true"}
    p = r.packages["gpu-driver"]
    assert p.stage_timeout == timedelta(minutes=30)
    assert p.interrupt == Interrupt(type="reboot")
    assert r.drain_config.timeout == timedelta(minutes=10)
    assert r.drain_config.grace_period == timedelta(seconds=30)
    assert r.pod_non_interrupt_labels.to_selector_string() == "workload=training"


def test_snake_case_names_are_accepted_too():
    r = RolloutInput(
        cluster="lab",
        name="c1",
        node_selectors=LabelSelector(match_labels={"a": "b"}),
        packages={"tool": {"version": "1.2.3", "image": "reg.example.com:5000/team/tool", "stage_timeout": 60}},
        soak_time="PT5M",
        dry_run=True,
    )
    assert r.packages["tool"].stage_timeout == timedelta(seconds=60)
    assert r.soak_time == timedelta(minutes=5)


def test_json_round_trip_uses_camel_case():
    r = RolloutInput.model_validate(APPENDIX_A)
    dumped = r.model_dump(mode="json")
    assert "nodeSelectors" in dumped and "deploymentPolicy" in dumped and "dryRun" in dumped
    assert "initialBatch" in dumped["deploymentPolicy"]["default"]["strategy"]["fixed"]
    assert RolloutInput.model_validate_json(r.model_dump_json()) == r


def test_safe_defaults():
    r = RolloutInput.model_validate(APPENDIX_A)
    # No policy: one node at a time (NodeWright: every node at once).
    assert r.deployment_policy.default.budget.count == 1
    fixed = r.deployment_policy.default.strategy.fixed
    assert fixed.initial_batch == 1 and fixed.batch_threshold == 100
    assert fixed.failure_threshold is None
    assert fixed.safety_limit == 100  # NodeWright: 50
    assert r.all_nodes is False
    assert r.approval == "none" and r.maintenance_windows == [] and r.soak_time == timedelta(0)
    assert r.dry_run is False
    d = DrainConfig()
    assert d.timeout == timedelta(minutes=30)  # NodeWright: unbounded
    assert not d.delete_empty_dir_data and not d.force and d.ignore_daemon_sets and not d.disable_eviction


def test_strategy_defaults_per_kind():
    r = RolloutInput.model_validate(
        spec(
            deploymentPolicy=policy(
                compartments=[
                    compartment("a", strategy={"linear": {}}),
                    compartment("b", strategy={"exponential": {"failureThreshold": 2}}),
                ]
            )
        )
    )
    lin = r.deployment_policy.compartments[0].strategy
    exp = r.deployment_policy.compartments[1].strategy
    assert lin.kind == "linear" and lin.params.delta == 1 and lin.params.safety_limit == 100
    assert exp.kind == "exponential" and exp.params.growth_factor == 2 and exp.params.failure_threshold == 2


def test_all_nodes_opt_in():
    r = RolloutInput.model_validate(spec(nodeSelectors={}, allNodes=True))
    assert r.all_nodes and r.node_selectors.is_empty()


def test_workflow_id_and_search_attributes():
    r = RolloutInput.model_validate(APPENDIX_A)
    assert r.workflow_id() == "rollout/lab/gpu-driver"
    attrs = {p.key.name: p.value for p in r.search_attributes()}
    assert attrs == {sa.CLUSTER.name: "lab", sa.PHASE.name: "pending"}
    dry = RolloutInput.model_validate(spec(dryRun=True))
    assert {p.key.name: p.value for p in dry.search_attributes()}[sa.PHASE.name] == "planning"


@pytest.mark.parametrize(
    "value, expected",
    [
        ("10m", timedelta(minutes=10)),
        ("1h30m", timedelta(hours=1, minutes=30)),
        ("1.5h", timedelta(minutes=90)),
        ("500ms", timedelta(milliseconds=500)),
        ("PT2H", timedelta(hours=2)),
        (90, timedelta(seconds=90)),
    ],
)
def test_durations_go_iso_or_seconds(value, expected):
    r = RolloutInput.model_validate(spec(packages={"tool": pkg(stageTimeout=value)}))
    assert r.packages["tool"].stage_timeout == expected


def test_semver_prerelease_is_fine():
    RolloutInput.model_validate(spec(packages={"tool": pkg(version="2.0.0-rc.1")}))


def test_image_with_registry_port_is_fine():
    RolloutInput.model_validate(spec(packages={"tool": pkg(image="localhost:5000/tool")}))
    RolloutInput.model_validate(spec(packages={"tool": pkg(image="ghcr.io/nvidia/nodewright-packages/tuned")}))


def test_config_interrupt_glob_matches_a_key():
    r = RolloutInput.model_validate(
        spec(
            packages={
                "tuned": pkg(
                    configMap={"a.conf": "x", "b.conf": "y", "run.sh": "z"},
                    configInterrupts={
                        "*.conf": {"type": "service", "services": ["tuned"]},
                        "run.sh": {"type": "reboot"},
                    },
                )
            }
        )
    )
    p = r.packages["tuned"]
    assert [i.type for i in p.config_interrupt(["a.conf"])] == ["service"]
    assert {i.type for i in p.config_interrupt(["a.conf", "run.sh"])} == {"service", "reboot"}
    assert p.config_interrupt(["other"]) == []


def test_dependencies_in_order():
    r = RolloutInput.model_validate(
        spec(
            packages={
                "base": pkg(),
                "driver": pkg(version="2.0.0", dependsOn={"base": "1.0.0"}),
                "tuning": pkg(dependsOn={"base": "1.0.0", "driver": "2.0.0"}),
            }
        )
    )
    assert topological_order({n: p.depends_on for n, p in r.packages.items()}) == ["base", "driver", "tuning"]


def test_maintenance_window_normalises_days():
    w = MaintenanceWindow.model_validate(
        {"days": ["Monday", "TUE", "sunday"], "startHour": 22, "endHour": 4, "timeZone": "Europe/Paris"}
    )
    assert w.days == ["mon", "tue", "sun"]


def test_drain_config_becomes_drain_settings():
    d = DrainConfig.model_validate(
        {
            "timeout": "10m",
            "gracePeriod": "2.5s",
            "deleteEmptyDirData": True,
            "force": True,
            "ignoreDaemonSets": False,
            "podSelector": "app=x",
        }
    )
    s = d.settings()
    assert isinstance(s, DrainSettings)
    assert s.timeout == timedelta(minutes=10)
    assert s.grace_period_seconds == 3
    assert s.delete_emptydir_data and s.force and not s.ignore_daemonsets
    assert s.pod_selector == "app=x"
    assert DrainConfig().settings().grace_period_seconds is None


def test_label_selector_string_form_and_matching():
    sel = LabelSelector.model_validate(
        {
            "matchLabels": {"b": "2", "a": "1"},
            "matchExpressions": [
                {"key": "zone", "operator": "In", "values": ["x", "y"]},
                {"key": "env", "operator": "NotIn", "values": ["prod"]},
                {"key": "gpu", "operator": "Exists"},
                {"key": "ignore", "operator": "DoesNotExist"},
            ],
        }
    )
    text = sel.to_selector_string()
    assert text == "a=1,b=2,zone in (x,y),env notin (prod),gpu,!ignore"
    assert parse_label_selector(text) == sel.requirements()
    labels = {"a": "1", "b": "2", "zone": "x", "gpu": "h100"}
    assert sel.matches(labels) and selector_matches(parse_label_selector(text), labels)
    assert not sel.matches(labels | {"env": "prod"})
    assert not sel.matches(labels | {"ignore": "true"})
    assert LabelSelector().matches({"anything": "x"})


def test_describe_errors_lines():
    with pytest.raises(ValidationError) as info:
        RolloutInput.model_validate(spec(packages={"tool": pkg(version="one")}))
    assert describe_errors(info.value)[0].startswith("packages.tool.version: ")


# ---------------------------------------------------------------- rejected specs


@pytest.mark.parametrize("version", ["1.0", "v1.0.0", "01.0.0", "1.0.0.0", "latest", "1.0.0+build.5", ""])
def test_non_semver_version(version):
    rejected(spec(packages={"tool": pkg(version=version)}), "packages.tool.version")


@pytest.mark.parametrize(
    "image, reason",
    [
        ("example/tool:1.0.0", "without a tag"),
        ("example/tool@sha256:" + "a" * 64, "without a digest"),
        ("Example/Tool", "not an image repository"),
        ("reg.example.com:5000/tool:v1", "without a tag"),
    ],
)
def test_image_with_tag_or_digest(image, reason):
    rejected(spec(packages={"tool": pkg(image=image)}), "packages.tool.image", reason)


def test_container_sha_format():
    rejected(spec(packages={"tool": pkg(containerSHA="sha256:abc")}), "packages.tool.containerSHA")
    RolloutInput.model_validate(spec(packages={"tool": pkg(containerSHA="sha256:" + "0" * 64)}))


@pytest.mark.parametrize("name", ["a", "Tool", "tool-", "1tool", "tool_x", "t" * 44])
def test_package_name(name):
    rejected(spec(packages={name: pkg()}), f"packages.{name}", "package name must match")


def test_no_packages():
    rejected(spec(packages={}), "packages")


def test_unknown_dependency():
    rejected(
        spec(packages={"foo": pkg(dependsOn={"bar": "1.0.0"})}), "packages.foo.dependsOn.bar: unknown package 'bar'"
    )


def test_dependency_version_must_be_semver():
    rejected(
        spec(packages={"foo": pkg(dependsOn={"bar": "latest"})}), "packages.foo.dependsOn", "bar:", "semantic version"
    )


def test_dependency_version_must_match_the_spec():
    rejected(
        spec(packages={"foo": pkg(dependsOn={"bar": "1.0.0"}), "bar": pkg(version="1.1.0")}),
        "packages.foo.dependsOn.bar: depends on version 1.0.0 but the spec installs 1.1.0",
    )


def test_self_dependency():
    rejected(spec(packages={"foo": pkg(dependsOn={"foo": "1.0.0"})}), "packages.foo.dependsOn.foo", "itself")


def test_dependency_cycle():
    lines = rejected(
        spec(
            packages={
                "aa": pkg(dependsOn={"cc": "1.0.0"}),
                "bb": pkg(dependsOn={"aa": "1.0.0"}),
                "cc": pkg(dependsOn={"bb": "1.0.0"}),
                "dd": pkg(dependsOn={"aa": "1.0.0"}),
            }
        ),
        "packages.aa.dependsOn: dependency cycle: aa -> cc -> bb -> aa",
    )
    assert "dd" not in lines


def test_config_interrupt_must_match_a_config_map_key():
    rejected(
        spec(packages={"tuned": pkg(configMap={"a.conf": "x"}, configInterrupts={"b.conf": {"type": "reboot"}})}),
        "packages.tuned.configInterrupts",
        "'b.conf' matches no configMap key",
    )
    rejected(
        spec(packages={"tuned": pkg(configInterrupts={"*": {"type": "reboot"}})}),
        "packages.tuned.configInterrupts",
        "matches no configMap key",
    )


def test_config_map_key_is_a_file_name():
    rejected(spec(packages={"tuned": pkg(configMap={"etc/a.conf": "x"})}), "packages.tuned.configMap", "no '/'")


@pytest.mark.parametrize(
    "interrupt, fragment",
    [
        ({"type": "service"}, "needs at least one entry in services"),
        ({"type": "reboot", "services": ["kubelet"]}, "takes no services"),
        ({"type": "noop", "services": ["kubelet"]}, "takes no services"),
        ({"type": "kexec"}, "Input should be"),
        ({"type": "service", "services": ["bad name"]}, "not a systemd unit name"),
    ],
)
def test_bad_interrupt(interrupt, fragment):
    rejected(spec(packages={"tool": pkg(interrupt=interrupt)}), "packages.tool.interrupt", fragment)


def test_stage_timeout_is_finite():
    rejected(spec(packages={"tool": pkg(stageTimeout=0)}), "packages.tool.stageTimeout", "positive")


def test_unknown_fields_are_rejected_with_their_path():
    rejected(spec(interruptionBudget={"percent": 10}), "interruptionBudget", "Extra inputs")
    rejected(spec(packages={"tool": pkg(env=[])}), "packages.tool.env", "Extra inputs")
    rejected(
        spec(deploymentPolicy=policy(compartments=[compartment(strategy={"fixed": {"intialBatch": 2}})])),
        "deploymentPolicy.compartments.0.strategy.fixed.intialBatch",
    )


def test_empty_node_selector_needs_all_nodes():
    rejected(spec(nodeSelectors={}), "nodeSelectors: an empty selector matches every node", "allNodes: true")
    rejected(spec(nodeSelectors={"matchLabels": {}, "matchExpressions": []}), "nodeSelectors")
    data = spec(allNodes=True)
    rejected(data, "allNodes: true conflicts with a non-empty nodeSelectors")


@pytest.mark.parametrize(
    "selector, path",
    [
        ({"matchLabels": {"bad key!": "x"}}, "nodeSelectors"),
        ({"matchLabels": {"a": "x,b"}}, "nodeSelectors"),
        ({"matchLabels": {"a": "x" * 64}}, "nodeSelectors"),
        ({"matchExpressions": [{"key": "a", "operator": "In"}]}, "nodeSelectors.matchExpressions.0"),
        (
            {"matchExpressions": [{"key": "a", "operator": "Exists", "values": ["x"]}]},
            "nodeSelectors.matchExpressions.0",
        ),
        (
            {"matchExpressions": [{"key": "a", "operator": "Gt", "values": ["1"]}]},
            "nodeSelectors.matchExpressions.0.operator",
        ),
        ({"matchExpressions": [{"key": "a", "operator": "In", "values": ["ok", "x)y"]}]}, "nodeSelectors"),
    ],
)
def test_invalid_node_selector(selector, path):
    rejected(spec(nodeSelectors=selector), path)


def test_empty_pod_non_interrupt_labels():
    rejected(spec(podNonInterruptLabels={}), "podNonInterruptLabels", "omit the field")


@pytest.mark.parametrize("where", ["default", "compartments.0"])
def test_both_budget_fields(where):
    budget = {"percent": 10, "count": 2}
    if where == "default":
        data = spec(deploymentPolicy={"default": {"budget": budget, "strategy": {"fixed": {}}}})
    else:
        data = spec(deploymentPolicy=policy(compartments=[compartment(budget=budget)]))
    rejected(data, f"deploymentPolicy.{where}.budget", "exactly one of percent or count")


def test_no_budget_field():
    rejected(
        spec(deploymentPolicy=policy(compartments=[compartment(budget={})])),
        "deploymentPolicy.compartments.0.budget",
        "exactly one of percent or count",
    )
    rejected(spec(deploymentPolicy={"default": {"strategy": {"fixed": {}}}}), "deploymentPolicy.default.budget")


@pytest.mark.parametrize(
    "budget, field", [({"percent": 0}, "percent"), ({"percent": 101}, "percent"), ({"count": 0}, "count")]
)
def test_budget_out_of_range(budget, field):
    rejected(
        spec(deploymentPolicy=policy(compartments=[compartment(budget=budget)])),
        f"deploymentPolicy.compartments.0.budget.{field}",
    )


@pytest.mark.parametrize(
    "strategy, path",
    [
        ({}, "strategy"),
        ({"fixed": {}, "linear": {}}, "strategy"),
        ({"fixed": {"initialBatch": 0}}, "strategy.fixed.initialBatch"),
        ({"fixed": {"batchThreshold": 0}}, "strategy.fixed.batchThreshold"),
        ({"fixed": {"batchThreshold": 101}}, "strategy.fixed.batchThreshold"),
        ({"linear": {"safetyLimit": 0}}, "strategy.linear.safetyLimit"),
        ({"linear": {"safetyLimit": 101}}, "strategy.linear.safetyLimit"),
        ({"linear": {"delta": 0}}, "strategy.linear.delta"),
        ({"exponential": {"growthFactor": 1}}, "strategy.exponential.growthFactor"),
        ({"exponential": {"failureThreshold": 0}}, "strategy.exponential.failureThreshold"),
        ({"fixed": {"delta": 1}}, "strategy.fixed.delta"),
    ],
)
def test_bad_strategy(strategy, path):
    rejected(
        spec(deploymentPolicy=policy(compartments=[compartment(strategy=strategy)])),
        f"deploymentPolicy.compartments.0.{path}",
    )


def test_default_strategy_is_required_with_a_default():
    rejected(spec(deploymentPolicy={"default": {"budget": {"count": 1}}}), "deploymentPolicy.default.strategy")


def test_compartment_rules():
    rejected(
        spec(deploymentPolicy=policy(compartments=[compartment("__default__")])),
        "deploymentPolicy.compartments.0.name",
        "reserved",
    )
    rejected(
        spec(
            deploymentPolicy=policy(
                compartments=[compartment("a"), compartment("a", selector={"matchLabels": {"x": "y"}})]
            )
        ),
        "deploymentPolicy.compartments",
        "1.name",
        "'a' is already the name of compartment 0",
    )
    same = {"matchLabels": {"env": "prod", "tier": "a"}}
    reordered = {
        "matchExpressions": [{"key": "tier", "operator": "In", "values": ["a"]}],
        "matchLabels": {"env": "prod"},
    }
    rejected(
        spec(deploymentPolicy=policy(compartments=[compartment("a", same), compartment("b", same)])),
        "deploymentPolicy.compartments",
        "1.selector: identical to the selector of compartment 0",
    )
    # In with one value is the same requirement as a matchLabels entry.
    rejected(
        spec(deploymentPolicy=policy(compartments=[compartment("a", same), compartment("b", reordered)])),
        "identical to the selector of compartment 0",
    )
    rejected(
        spec(deploymentPolicy=policy(compartments=[compartment("a", selector={})])),
        "deploymentPolicy.compartments.0.selector",
        "use deploymentPolicy.default",
    )
    rejected(
        spec(deploymentPolicy=policy(compartments=[compartment("a", selector={"matchLabels": {"a": "b,c"}})])),
        "deploymentPolicy.compartments.0.selector",
    )


@pytest.mark.parametrize(
    "drain, path",
    [
        ({"disableEviction": True}, "drainConfig.disableEviction"),
        ({"timeout": 0}, "drainConfig.timeout"),
        ({"timeout": "-5m"}, "drainConfig.timeout"),
        ({"gracePeriod": -1}, "drainConfig.gracePeriod"),
        ({"podSelector": "a in (b"}, "drainConfig.podSelector"),
        ({"skipWaitForDeleteTimeout": 1}, "drainConfig.skipWaitForDeleteTimeout"),
    ],
)
def test_bad_drain_config(drain, path):
    rejected(spec(drainConfig=drain), path)


@pytest.mark.parametrize(
    "window, path",
    [
        ({"startHour": 1, "endHour": 5, "timeZone": "Mars/Olympus"}, "maintenanceWindows.0.timeZone"),
        ({"startHour": 1, "endHour": 5, "timeZone": "../etc/passwd"}, "maintenanceWindows.0.timeZone"),
        ({"startHour": 3, "endHour": 3}, "maintenanceWindows.0"),
        ({"startHour": 0, "endHour": 24}, None),
        ({"startHour": 0, "endHour": 0}, "maintenanceWindows.0"),
        ({"startHour": 24, "endHour": 3}, "maintenanceWindows.0.startHour"),
        ({"startHour": 1, "endHour": 25}, "maintenanceWindows.0.endHour"),
        ({"startHour": 1, "endHour": 3, "days": []}, "maintenanceWindows.0.days"),
        ({"startHour": 1, "endHour": 3, "days": ["funday"]}, "maintenanceWindows.0.days.0"),
    ],
)
def test_maintenance_windows(window, path):
    data = spec(maintenanceWindows=[window])
    if path is None:
        RolloutInput.model_validate(data)
    else:
        rejected(data, path)


def test_soak_time_and_approval():
    rejected(spec(soakTime=-1), "soakTime")
    rejected(spec(approval="always"), "approval")
    assert RolloutInput.model_validate(spec(approval="compartment", soakTime="15m")).soak_time == timedelta(minutes=15)


def test_cluster_and_name_are_object_names():
    rejected(spec(cluster="Bad Cluster"), "cluster")
    rejected(spec(name="a/b"), "name")


def test_several_errors_are_all_reported():
    with pytest.raises(ValidationError) as info:
        RolloutInput.model_validate(
            spec(
                packages={"tool": pkg(version="x", image="a:b")},
                deploymentPolicy=policy(compartments=[compartment(budget={"percent": 200})]),
            )
        )
    paths = {line.split(":")[0] for line in describe_errors(info.value)}
    assert {"packages.tool.version", "packages.tool.image", "deploymentPolicy.compartments.0.budget.percent"} <= paths


# ---------------------------------------------------------------- dependency ordering


def test_dependency_levels_are_deterministic_waves():
    deps = {"d": ["b", "c"], "c": ["a"], "b": ["a"], "a": [], "e": []}
    assert dependency_levels(deps) == [["a", "e"], ["b", "c"], ["d"]]
    assert topological_order(deps) == ["a", "e", "b", "c", "d"]


def test_dependency_cycle_names_the_cycle():
    with pytest.raises(DependencyCycle) as info:
        topological_order({"a": ["b"], "b": ["c"], "c": ["b"], "d": []})
    assert info.value.cycle == ["b", "c", "b"]
    with pytest.raises(DependencyCycle):
        topological_order({"a": ["a"]})


def test_uninstall_and_node_gate_fields_are_checked():
    """NodeWright's uninstall rule, and the node-side options that would leave a node stuck."""
    rejected(
        spec(packages={"agent": pkg(uninstall={"apply": True})}),
        "packages.agent.uninstall",
        "apply: true needs enabled: true",
    )
    rejected(
        spec(
            packages={
                "agent": pkg(uninstall={"enabled": True, "apply": True}),
                "tool": pkg(dependsOn={"agent": "1.0.0"}),
            }
        ),
        "packages.tool.dependsOn.agent: 'agent' is being uninstalled",
    )
    rejected(spec(autoTaintNewNodes=True), "autoTaintNewNodes", "runtimeRequired: true")
    ok = RolloutInput.model_validate(
        spec(
            runtimeRequired=True,
            autoTaintNewNodes=True,
            allowDowngrade=True,
            packages={"agent": pkg(uninstall={"enabled": True, "apply": True})},
        )
    )
    assert ok.packages["agent"].uninstall.apply and ok.runtime_required and ok.allow_downgrade


def test_semver_precedence_tells_a_downgrade():
    from activities.support.semver import is_downgrade

    assert is_downgrade("1.10.0", "1.9.0") and not is_downgrade("1.9.0", "1.10.0")
    assert is_downgrade("1.0.0", "1.0.0-rc.1") and is_downgrade("1.0.0-rc.10", "1.0.0-rc.2")
    assert is_downgrade("1.0.0-beta", "1.0.0-alpha") and not is_downgrade("1.2.0", "1.2.0")
    assert not is_downgrade("not-a-version", "1.0.0")
