import re

import pytest

from harness.errors import ComponentNameError
from harness.spec import names


@pytest.mark.parametrize("text", ["L1H6", "L0H3", "L12H0", "L1H6.q", "L1H6.k", "L1H6.v",
                                  "embed", "logits", "L3.mlp"])
def test_component_round_trip(text):
    assert str(names.parse_component(text)) == text


@pytest.mark.parametrize("text", ["L0H3 -> L1H6.k", "embed -> L0H1.q", "L1H6 -> logits", "embed -> logits"])
def test_edge_round_trip(text):
    e = names.parse_edge(text)
    assert str(e) == text
    assert names.parse_edge(text.replace(" ", "")) == e


@pytest.mark.parametrize("text", ["L0H2 -> L1.mlp", "L1H0 -> L1.mlp", "L0.mlp -> L1H0.v", "L0.mlp -> L1.mlp",
                                  "L0H1 + L0.mlp -> logits", "embed + L0H3 -> L2H1.k"])
def test_mlps_and_groups_are_edge_ends(text):
    """MLPs send and receive (a head feeds its own layer's MLP); groups send together."""
    e = names.parse_edge(text)
    assert str(e) == text and names.parse_edge(text.replace(" ", "")) == e


@pytest.mark.parametrize("text,why", [
    ("L1.mlp -> L1H0.q", "does not go forward"), ("L1.mlp -> L1.mlp", "does not go forward"),
    ("L0H1 + L0H1 -> L1H0.q", "names L0H1 twice"), ("L1H0 + L0H1 -> L1H0.q", "does not go forward")])
def test_bad_edges(text, why):
    with pytest.raises(ComponentNameError, match=why):
        names.parse_edge(text)


def test_composition_edges_take_heads_only():
    """A composition edge names one head and a head input: an MLP there gets the one
    message about MLPs and composition scores, a group is refused."""
    for text, end in (("L0H2 -> L1.mlp", "the receiver of a composition edge"),
                      ("L0.mlp -> L1H0.v", "the sender of a composition edge")):
        with pytest.raises(ComponentNameError, match=f"is not {end}; .*; {re.escape(names.MLP_NOTE)}$"):
            names.parse_edge(text, names.HEAD_ROUTE)
    with pytest.raises(ComponentNameError, match="not a group"):
        names.parse_edge("L0H1 + L0H2 -> L1H0.k", names.HEAD_ROUTE)


def test_paths_parse_and_go_forward():
    p = names.parse_path("L0H7 + L0.mlp -> L1H5.k -> L1.mlp -> L2H3.q -> logits")
    assert str(p) == "L0H7 + L0.mlp -> L1H5.k -> L1.mlp -> L2H3.q -> logits" and p.as_edge is None
    assert names.parse_path("L0H7 -> L1H5.k").as_edge == names.parse_edge("L0H7 -> L1H5.k")
    for bad, why in (("L0H7 -> logits -> L1H0.q", "is not a path hop"), ("L1H0 -> L1H1.k", "does not go forward"),
                     ("L0H7", "is not a path")):
        with pytest.raises(ComponentNameError, match=why):
            names.parse_path(bad)


def test_parsed_values_are_frozen_and_structured():
    e = names.parse_edge("L0H3 -> L1H6.k")
    assert e.sender == names.Head(0, 3)
    assert e.receiver == names.HeadInput(names.Head(1, 6), "k")
    with pytest.raises(AttributeError):
        e.sender.layer = 5  # type: ignore[misc]


@pytest.mark.parametrize("text,needle", [
    ("L1H", "not a component name"), ("l1h6", "not a component name"), ("L1H6.z", "not a component"),
    ("head", "allowed"), ("", "not a component"), ("L01H5", "not a component"), ("L1H05.k", "not a component"),
])
def test_bad_component(text, needle):
    with pytest.raises(ComponentNameError, match=needle):
        names.parse_component(text)


@pytest.mark.parametrize("text,needle", [
    ("L1H6 -> L0H3.k", "does not go forward"), ("L1H6 -> L1H2.q", "does not go forward"),
    ("L0H3 -> L1H6", "did you mean L1H6.q"), ("logits -> L1H6.k", "sender"),
    ("L0H3 L1H6.k", "not an edge"), ("L0H1 -> embed", "receiver"),
])
def test_bad_edge(text, needle):
    with pytest.raises(ComponentNameError, match=needle):
        names.parse_edge(text)


def test_parse_head_rejects_other_components():
    with pytest.raises(ComponentNameError, match="not a head"):
        names.parse_head("L1H6.k")


def test_range_check_names_the_model_range():
    names.check_in_model(names.parse_edge("L0H3 -> L1H7.k"), 2, 8)
    with pytest.raises(ComponentNameError, match=r"layers 0\.\.1 and heads 0\.\.7"):
        names.check_in_model(names.parse_head("L1H8"), 2, 8)
    with pytest.raises(ComponentNameError, match="layers 0..1"):
        names.check_in_model(names.parse_edge("L0H0 -> L2H0.q"), 2, 8)
    with pytest.raises(ComponentNameError, match="attention-only"):
        names.check_in_model(names.parse_component("L0.mlp"), 2, 8, has_mlp=False)
