"""Edge circuit claims (kind: circuit with edges) end to end: the edge circuit of every edge among a
node circuit's heads gives the node circuit's faithfulness; every edge of the graph reads 1
exactly; random edge circuits are matched per receiver and stop when the sequential test
decides; every edge of the circuit gets its sufficiency step on the ladder; an edge the graph
lacks is a one-line error."""

from __future__ import annotations

import hashlib

import numpy as np
import pytest
import yaml

import harness
from harness.claims.circuit_plans import EdgeCircuit
from harness.claims.circuit_spec import CircuitClaim
from harness.mech.graph.structure import Graph
from harness.spec import names

from .graph_helpers import ROOT, graph_runs

HEADS = ["L0H3", "L0H4", "L0H5", "L0H6", "L0H7", *[f"L1H{h}" for h in range(8)]]


def write(tmp_path, claims: list[dict]) -> str:
    f = tmp_path / "h.yaml"
    f.write_text(yaml.safe_dump({
        "harness": 1, "name": "edge-circuits", "model": str(ROOT / "fixtures" / "induction-2l"),
        "data": {"generator": "repeated_tokens", "n_prompts": 40, "segment_length": 12, "split": "test"},
        "claims": claims}))
    return str(f)


@pytest.fixture(scope="module")
def evidence(tmp_path_factory):
    g = Graph(2, 8, False)
    among = [str(e) for e in g.edges_of(g.node_mask([names.Head(int(h[1]), int(h[3])) for h in HEADS]))]
    every = [str(e) for e in g.edges()]
    folder = tmp_path_factory.mktemp("ec")
    (folder / "small.txt").write_text(SMALL_FILE)
    claims = [{"id": "node", "kind": "circuit", "heads": HEADS, "at_least": 0.5},
              {"id": "edges-among", "kind": "circuit", "edges": among, "at_least": 0.5},
              {"id": "every-edge", "kind": "circuit", "edges": every, "at_most": 1.5},
              {"id": "small", "kind": "circuit", "at_least": 0.3, "edges": SMALL},
              {"id": "small-from-file", "kind": "circuit", "at_least": 0.3, "edges_from": "small.txt", "top": 5}]
    return harness.run(write(folder, claims), device="cpu")


SMALL = ["embed -> L0H7.v", "L0H7 -> L1H5.k", "embed -> L1H5.v", "embed -> L1H5.q", "L1H5 -> logits"]
SMALL_FILE = "# the small circuit, then one edge more\n" + "\n".join(SMALL) + "\n\nL0H3 -> L1H5.q\n"


def test_edges_named_by_a_file_are_the_listed_circuit_and_hashed_into_the_evidence(evidence, tmp_path_factory):
    """`edges_from: small.txt` with `top: 5` (a comment, the five edges, a blank line, one more) is the
    circuit of the five listed edges, to the last bit, and the file's sha256 is in the evidence."""
    listed, named = evidence.claim("small"), evidence.claim("small-from-file")
    assert named.details.edges == listed.details.edges and set(named.details.edges) == set(SMALL)
    assert named.value == listed.value and named.details.circuit_metric_mean == listed.details.circuit_metric_mean
    (ref,) = evidence.hypothesis["references"]
    assert (ref["claim"], ref["file"], ref["top"], ref["edges"]) == ("small-from-file", "small.txt", 5, 5)
    assert ref["sha256"] == hashlib.sha256(SMALL_FILE.encode()).hexdigest()


def test_edges_among_a_node_circuit_are_the_node_circuit(evidence):
    node, edges = evidence.claim("node"), evidence.claim("edges-among")
    assert edges.value == pytest.approx(node.value, abs=1e-6)
    assert edges.details.circuit_metric_mean == pytest.approx(node.details.circuit_metric_mean, abs=1e-6)
    assert edges.details.empty_metric_mean == pytest.approx(node.details.empty_metric_mean, abs=1e-6)
    assert edges.details.heads == HEADS  # the nodes its edges join
    assert sum(sum(r.values()) for r in edges.details.edge_classes.values()) == len(edges.details.edges)


def test_every_edge_reads_one_exactly(evidence):
    c = evidence.claim("every-edge")
    assert c.value == 1.0 and c.ci == [1.0, 1.0] and c.verdict == "PASS"
    assert c.details.graph_edges == len(c.details.edges) == 257
    # a circuit of more than 60 edges is one ladder row (the five-edge circuit below has a row per edge)
    (row,) = [r for r in evidence.ladder if any(s.claim == "every-edge" for steps in r.rungs.values() for s in steps)]
    assert row.mechanism == "edge circuit every-edge (257 edges)" and "sufficiency" in row.rungs


def test_random_edge_circuits_stop_when_decided_and_the_ladder_has_every_edge(evidence):
    c = evidence.claim("small")
    d = c.details
    assert d.random_draws_max == 100 and d.random_circuits in (8, 16, 32, 64, 100)
    assert d.beat_decision in ("more", "not more", "undecided") and d.random_draw.startswith("5 edges, as many")
    steps = {row.mechanism: row.rungs for row in evidence.ladder}
    for e in d.edges:
        assert "small" in [s.claim for s in steps[e]["sufficiency"]]


def test_random_edge_circuits_are_matched_per_receiver():
    runs = graph_runs("induction", 6)
    claim = CircuitClaim.model_validate({"id": "c", "kind": "circuit", "at_least": 0.5,
                                         "edges": ["embed -> L0H7.v", "L0H7 -> L1H5.k", "L0H3 -> L1H5.k",
                                                   "L1H5 -> logits"]})
    plan = EdgeCircuit(claim, runs)
    drawn = []
    runs_masks = runs.edge_circuits  # record the masks the plan asks for

    def record(masks, kind, drop=None):
        drawn.extend(masks)
        return runs_masks(masks, kind, drop)

    runs.edge_circuits = record  # type: ignore[method-assign]
    plan.random(np.random.default_rng(0), 30, "resample")
    assert len(drawn) == 30
    for m in drawn:
        assert (m.sum(0) == plan.mask.sum(0)).all() and not np.array_equal(m, plan.mask)
        assert not (m & ~plan.graph.adjacency).any()


def test_an_edge_the_graph_lacks_is_one_line(tmp_path, capsys):
    from harness.cli import main

    f = write(tmp_path, [{"id": "c", "kind": "circuit", "edges": ["L0H7 -> L1H5.k", "L1H5 -> L1.mlp"],
                          "at_least": 0.5}])
    assert main(["run", f, "--out", str(tmp_path / "r")]) == 2
    err = capsys.readouterr().err
    assert "L1.mlp" in err and "Traceback" not in err and not (tmp_path / "r").exists()
