"""What a run spends and may hold: forward-equivalents counted where the model runs
(harness.cost) against the cost model's formulas, and the memory budget (harness.memory):
sizes, the one-line stop when the base runs' caches cannot fit, chunks within the budget."""

from __future__ import annotations

import pytest

from harness import cost, memory
from harness.errors import UserError
from harness.spec import names

from .conftest import HYPOTHESES
from .graph_helpers import graph_runs
from .test_cli import harness_cli


@pytest.mark.parametrize(("text", "size"), [("3G", 3 * 2**30), ("512M", 512 * 2**20), ("2.5GiB", int(2.5 * 2**30)),
                                            ("1000", 1000), ("64 kb", 64 * 2**10)])
def test_memory_sizes(text, size):
    assert memory.parse(text, "--memory") == size


@pytest.mark.parametrize("text", ["", "G", "-3G", "3X", "0", "three"])
def test_bad_memory_sizes_name_the_source(text):
    with pytest.raises(UserError, match=r"--memory: .* is not a memory size"):
        memory.parse(text, "--memory")


def test_working_memory_is_the_stage_own_unless_the_budget_is_smaller():
    assert memory.working(64 * 2**20) == 64 * 2**20  # outside a budget
    with memory.using(8 * 2**30):
        assert memory.working(64 * 2**20) == 64 * 2**20
    with memory.using(80 * 2**20):
        assert memory.working(64 * 2**20) == 10 * 2**20


def test_working_memory_on_cuda_is_an_eighth_of_the_budget():
    """On a CUDA device a batch's cost is mostly launches and Python: chunks take the budget's share,
    larger or smaller than the stage's own size on the CPU."""
    with memory.using(8 * 2**30, device="cuda:0"):
        assert memory.working(64 * 2**20) == 2**30
    with memory.using(80 * 2**20, device="cuda"):
        assert memory.working(64 * 2**20) == 10 * 2**20
    with memory.using(8 * 2**30, device="cpu"):
        assert memory.working(64 * 2**20) == 64 * 2**20


def test_default_budget_on_cuda_is_the_smaller_of_host_and_device(monkeypatch):
    """Half the memory available: the host's on the CPU; for a model on a CUDA device, the smaller
    of the host's and what the process may hold there (free + held: the weights count as held)."""
    import torch

    monkeypatch.delenv(memory.ENV, raising=False)
    monkeypatch.setattr(memory, "host_available", lambda: 64 * 2**30)
    asked = []

    def mem_get_info(device):
        asked.append(device)
        return 9 * 2**30, 24 * 2**30

    monkeypatch.setattr(torch.cuda, "mem_get_info", mem_get_info)
    monkeypatch.setattr(torch.cuda, "memory_reserved", lambda device: 15 * 2**30)
    assert memory.chosen() == memory.chosen(device="cpu") == 32 * 2**30
    assert memory.chosen(device=torch.device("cuda:1")) == 12 * 2**30  # half of 9 free + 15 held
    assert asked == [torch.device("cuda:1")]
    monkeypatch.setattr(memory, "host_available", lambda: 16 * 2**30)
    assert memory.chosen(device="cuda") == 8 * 2**30  # the host is the smaller
    assert memory.chosen(3 * 2**30, device="cuda") == 3 * 2**30  # --memory wins
    with memory.using(device="cpu") as budget:
        assert budget == 8 * 2**30


def test_caches_that_do_not_fit_stop_with_the_prompts_that_would(tmp_path):
    with memory.using(100 * 2**20), pytest.raises(memory.MemoryBudgetError, match="at most 40 prompts fit"):
        memory.check_cache(2**20, 1000, 2, 20 * 2**20, "the base runs of 1000 prompts")
    with memory.using(100 * 2**20):
        memory.check_cache(2**20, 40, 2, 20 * 2**20, "the base runs of 40 prompts")  # fits


def test_run_over_its_budget_says_so_in_one_line_and_writes_nothing(tmp_path):
    out = tmp_path / "report"
    r = harness_cli("run", HYPOTHESES / "induction.yaml", "--out", out, "--memory", "3M")
    assert r.returncode == 2
    errors = [line for line in r.stderr.splitlines() if not line.startswith("[")]
    assert len(errors) == 1 and errors[0].startswith("error: memory: the base runs of 200 prompts would hold")
    assert "budget of 3.0 MiB" in errors[0] and "prompts fit" in errors[0] and "--memory" in errors[0]
    assert "Traceback" not in r.stderr
    assert not out.exists()


def test_an_attribution_claim_costs_its_steps_and_a_backward_to_the_receiver():
    """EAP-IG with m steps on one edge: m forwards and m backwards from the logits to the
    receiver's layer l of L: m (1 + (L - l) / L) forward-equivalents; EAP one point."""
    runs = graph_runs("names", 6)
    L = runs.n_layers
    runs.graph_model()  # built (and checked) outside the count
    for edge, layer in ((names.parse_edge("L0H1 -> L2H0.k"), 2), (names.parse_edge("L0.mlp -> L1H2.q"), 1),
                        (names.parse_edge("embed -> logits"), L)):
        for method, points in (("eap-ig", 3), ("eap", 1)):
            with cost.counting(runs.ds.n) as ledger:
                runs.edge_prompt_scores(edge, method, steps=3, batch=4)
            assert ledger.total == pytest.approx(points * (1 + (L - layer) / L))


def test_an_ablation_costs_the_layers_after_the_ablated_one():
    runs = graph_runs("names", 6)
    L = runs.n_layers
    runs.ablated([names.Head(1, 1)], "zero")  # the once-per-model check that blocks can start inside (2 prompts)
    with cost.counting(runs.ds.n) as ledger:
        runs.ablated([names.Head(1, 0)], "zero")
    assert ledger.total == pytest.approx((L - 1) / L)
