"""A fleet firmware update's waves with `batch_by` (workflows/firmware/waves.py): whole domains, the smallest as the
canary, sizes rounded up to whole domains, a domain never split across waves, the domains a stop leaves mixed, and
when a domain's nodes may return. Pure rules; the run on the lab is in test_fleet_firmware.py."""

from __future__ import annotations

import random

import pytest
from pydantic import ValidationError

from activities.kube.topology import CLIQUE_LABEL, NodePlace, place_of
from workflows.firmware.fleet import FleetFirmwareInput
from workflows.firmware.waves import (
    FirmwareWaves,
    WaveBook,
    domain_verdict,
    domains_left_mixed,
    domains_of,
    own_domains_note,
)

BUNDLE = {"name": "b", "components": [{"name": "BIOS", "image_uri": "https://images/bios.bin", "version": "2"}]}


def places(domain_of: dict[str, str]) -> dict[str, NodePlace]:
    return {s: place_of(s, {CLIQUE_LABEL: f"{d}.1"}) for s, d in domain_of.items()}


def run_waves(
    book: WaveBook, servers: list[str], up_to_date: frozenset[str] = frozenset(), at_once: int = 1
) -> list[list[str]]:
    """Every server through `book` (the fleet's loop: the next wave when one is done, starts while startable, the
    oldest running finishing first); each wave's servers in start order."""
    pending = dict.fromkeys(servers)
    running: list[str] = []
    waves: list[list[str]] = []
    while pending or running:
        book.next_wave()
        while pending and book.startable() and len(running) < at_once:
            server = book.next_server(pending)
            del pending[server]
            wave = book.start(server)
            waves += [[] for _ in range(wave + 1 - len(waves))]
            waves[wave].append(server)
            running.append(server)
        assert running, "nothing startable with servers pending"
        done = running.pop(0)
        assert book.finished(done, changed=done not in up_to_date, failed=False) is None
    return waves


def book_of(domain_of: dict[str, str], batch_sizes: list[int], concurrent: int = 2) -> WaveBook:
    book = WaveBook(FirmwareWaves(batch_sizes=batch_sizes), concurrent, batch_by="nvlinkDomain")
    book.places = places(domain_of)
    return book


def test_the_canary_is_the_smallest_domain_and_later_waves_take_whole_domains_in_the_servers_order():
    # A: a1..a3, B: b1 b2, C: c1 c2, listed interleaved; B and C tie for smallest, B comes first.
    servers = ["a1", "b1", "c1", "a2", "b2", "c2", "a3"]
    domain_of = {s: s[0].upper() for s in servers}
    book = book_of(domain_of, batch_sizes=[2])
    waves = run_waves(book, servers, at_once=2)
    assert waves == [["b1", "b2"], ["a1", "a2", "a3"], ["c1", "c2"]]  # A: size 2 rounded up to its 3
    assert book.wave_domains == [["B"], ["A"], ["C"]]
    # Node by node (no batch_by) the same servers run in their order, splitting every domain.
    plain = run_waves(WaveBook(FirmwareWaves(batch_sizes=[2]), 2), servers, at_once=2)
    assert plain == [["a1"], ["b1", "c1"], ["a2", "b2"], ["c2", "a3"]]


def test_a_wave_takes_domains_up_to_its_size_rounded_up_and_the_bmc_limit_only_paces_it():
    servers = [f"{d}{i}" for d in "pqrs" for i in range(3)] + ["t0"]
    domain_of = {s: s[0] for s in servers}
    book = book_of(domain_of, batch_sizes=[4, 7])
    waves = run_waves(book, servers, at_once=1)
    # The canary: t (1 server); 4 -> p, q (6); 7 -> r, s (6, all that is left).
    assert book.wave_domains == [["t"], ["p", "q"], ["r", "s"]]
    assert waves == [["t0"], servers[:6], servers[6:12]]


def test_servers_already_current_free_their_place_for_the_next_whole_domain():
    servers = ["a1", "a2", "b1", "b2", "b3", "c1", "c2"]
    domain_of = {s: s[0] for s in servers}
    book = book_of(domain_of, batch_sizes=[2])
    # The canary a is current throughout: it changed nothing, so the canary takes the next smallest, c.
    waves = run_waves(book, servers, up_to_date=frozenset({"a1", "a2"}), at_once=2)
    assert book.wave_domains == [["a", "c"], ["b"]] and waves == [["a1", "a2", "c1", "c2"], ["b1", "b2", "b3"]]


@pytest.mark.parametrize("seed", range(20))
def test_no_wave_splits_a_domain(seed):
    rng = random.Random(seed)
    servers = [f"s{i:02d}" for i in range(rng.randint(5, 40))]
    domain_of = {s: f"d{rng.randint(0, 6)}" for s in servers}
    sizes = [rng.randint(1, 9) for _ in range(rng.randint(1, 3))]
    current = frozenset(rng.sample(servers, rng.randint(0, len(servers) // 2)))
    book = book_of(domain_of, batch_sizes=sizes, concurrent=rng.randint(1, 4))
    waves = run_waves(book, servers, up_to_date=current, at_once=rng.randint(1, 4))
    wave_of = {s: w for w, members in enumerate(waves) for s in members}
    for domain in set(domain_of.values()):
        assert len({wave_of[s] for s in servers if domain_of[s] == domain}) == 1, (domain, waves)
    assert sorted(d for ds in book.wave_domains for d in ds) == sorted(set(domain_of.values()))


def test_a_server_without_a_place_is_a_domain_of_its_own_and_racks_are_units_too():
    placed = {"n1": NodePlace(node="n1", domain="u", rack="r1"), "n2": NodePlace(node="n2", domain="u", rack="r2")}
    assert domains_of(["n1", "n2", "bare"], placed, "nvlinkDomain") == {"n1": "u", "n2": "u", "bare": "node:bare"}
    assert domains_of(["n1", "n2", "bare"], placed, "rack") == {"n1": "r1", "n2": "r2", "bare": "node:bare"}
    note = own_domains_note({"bare": "no Kubernetes node", "n3": f"no {CLIQUE_LABEL} label"}, "nvlinkDomain")
    assert note == (f"waves take whole NVLink domains; 2 server(s) each a NVLink domain of its own: bare (no "
                    f"Kubernetes node), n3 (no {CLIQUE_LABEL} label)")  # fmt: skip
    assert own_domains_note({}, "rack") == "waves take whole racks"


def test_a_domain_is_left_mixed_by_a_failure_or_a_stop_inside_it_not_while_it_runs():
    domains = {"a1": "A", "a2": "A", "b1": "B", "b2": "B", "c1": "C", "d1": "D", "e1": "E", "e2": "E"}
    states = {"a1": "updated", "a2": "pending", "b1": "updated", "b2": "running", "c1": "failed",
              "d1": "up-to-date", "e1": "updated", "e2": "up-to-date"}  # fmt: skip
    assert domains_left_mixed(domains, states) == ["A", "C"]
    assert domains_left_mixed(domains, {**states, "a2": "skipped", "b2": "failed"}) == ["A", "B", "C"]
    assert domains_left_mixed(domains, dict.fromkeys(domains, "pending")) == []


def test_a_domain_returns_only_with_every_server_on_the_bundle_and_one_set_of_versions_read_back():
    on = {"BIOS": "2", "CPLD": "7"}
    assert domain_verdict({"a1": "updated", "a2": "up-to-date"}, {"a1": on, "a2": on}, {}) is None
    failed = domain_verdict({"a1": "updated", "a2": "failed", "a3": "skipped"}, {"a1": on},
                            {"a2": "flash write failed at block 7", "a3": "fleet aborted: freeze"})  # fmt: skip
    assert failed == ("not every server on the bundle: a2 failed (flash write failed at block 7); a3 skipped "
                      "(fleet aborted: freeze)")  # fmt: skip
    differ = domain_verdict({"a1": "updated", "a2": "updated", "a3": "updated"},
                            {"a1": on, "a2": {**on, "CPLD": "6"}, "a3": on}, {})  # fmt: skip
    assert differ == "versions read back differ: CPLD 7 on a1, a3; 6 on a2"


def test_the_book_stops_at_a_failure_inside_a_domain_leaving_its_other_servers_unstarted():
    servers = ["a1", "a2", "b1", "b2", "b3"]
    book = book_of({s: s[0] for s in servers}, batch_sizes=[1])
    pending = dict.fromkeys(servers)
    first = book.next_server(pending)
    del pending[first]
    book.start(first)
    assert first == "a1" and book.finished("a1", changed=True, failed=False) is None and book.startable()
    assert book.next_server(pending) == "a2"  # the canary's domain goes on: a wave ends only with its domains
    book.start("a2")
    assert book.finished("a2", changed=True, failed=False) is None and book.next_wave()
    del pending["a2"]
    assert [book.start(book.next_server(pending))] == [1]
    assert book.finished("b1", changed=False, failed=True) == "1 server(s) failed (threshold 1), the last b1"
    assert book.taken == ["b2", "b3"] and not book.next_wave()  # b's rest wait in the wave, never a later one


def servers_input(**fields) -> dict:
    kubernetes = {"cluster": "lab", "take_out_of_service": True}
    return {"name": "fw", "bundle": BUNDLE, "servers": [
        {"name": "n1", "bmc": {"url": "https://bmc-1"}, "kubernetes": kubernetes},
        {"name": "n2", "bmc": {"url": "https://bmc-2"}},
    ], **fields}  # fmt: skip


@pytest.mark.parametrize(
    "fields, message",
    [
        ({"batch_by": "zone"}, "batch_by"),
        ({"batch_by": "rack", "topology": {"rack": ""}}, "topology.rack"),
        ({"batch_by": "nvlinkDomain", "topology": {"switch": "x"}}, "topology.switch"),
        ({"batch_by": "nvlinkDomain", "waves": {"canary": 2}}, "waves.canary: with batch_by nvlinkDomain the canary"),
    ],
)
def test_batch_by_and_its_topology_are_validated_naming_the_field(fields, message):
    with pytest.raises(ValidationError, match=message):
        FleetFirmwareInput.model_validate(servers_input(**fields))


def test_batch_by_needs_a_server_that_is_a_kubernetes_node():
    bare = {**servers_input(batch_by="nvlinkDomain"), "servers": [{"name": "n2", "bmc": {"url": "https://bmc-2"}}]}
    with pytest.raises(ValidationError, match="batch_by: a server's domain comes from its Kubernetes node's labels"):
        FleetFirmwareInput.model_validate(bare)
    inp = FleetFirmwareInput.model_validate(servers_input(batch_by="nvlinkDomain"))
    assert inp.topology.clique == CLIQUE_LABEL and inp.waves.canary == 1
