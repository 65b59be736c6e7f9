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


@pytest.mark.parametrize("text,end", [("L0H2 -> L1.mlp", "an edge receiver"), ("L0.mlp -> L1H0.v", "an edge sender")])
def test_mlps_are_not_edge_ends(text, end):
    """MLP names parse as nodes, but no edge field takes them: one message says so."""
    assert str(names.parse_component("L1.mlp")) == "L1.mlp"
    with pytest.raises(ComponentNameError, match=f"is not {end}; .*; {names.MLP_NOTE}$"):
        names.parse_edge(text)
    assert names.MLP_NOTE in names.EDGE_RULE
    assert (names.edge_end_unsupported(names.Mlp(1), "into")
            == f"edge patching into L1.mlp is not supported: {names.EDGE_RULE}")


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
