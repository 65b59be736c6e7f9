"""Statistics against closed forms and scipy."""

import numpy as np
import pytest

from harness import stats
from harness.evidence.verdicts import FAIL, INCONCLUSIVE, PASS, threshold_verdict


def test_mean_ci_covers_and_is_seeded():
    x = np.random.default_rng(0).normal(1.0, 1.0, 400)
    a = stats.mean_ci(x, 2000, 0.95, seed=1)
    assert a.estimate == pytest.approx(x.mean())
    se = x.std(ddof=1) / np.sqrt(len(x))
    assert a.low == pytest.approx(x.mean() - 1.96 * se, abs=0.3 * se)
    assert a.high == pytest.approx(x.mean() + 1.96 * se, abs=0.3 * se)
    assert stats.mean_ci(x, 2000, 0.95, seed=1) == a


def test_constant_data_gives_point_interval():
    iv = stats.mean_ci(np.full(10, 0.25), 500, 0.95, seed=0)
    assert (iv.estimate, iv.low, iv.high) == (0.25, 0.25, 0.25)


def test_ratio_of_means_paired():
    num, den = np.array([1.0, 2.0, 3.0]), np.array([2.0, 4.0, 6.0])
    assert stats.ratio_of_means(num, den) == pytest.approx(0.5)
    iv = stats.bootstrap_ci([num, den], stats.ratio_of_means, 500, 0.95, 0)
    assert iv.low == iv.high == pytest.approx(0.5)  # paired resampling keeps the ratio


def test_sign_flip_pvalue():
    rng = np.random.default_rng(3)
    assert stats.sign_flip_pvalue(rng.normal(2, 1, 50), 2000, 0) == pytest.approx(1 / 2001)
    p_null = [stats.sign_flip_pvalue(rng.normal(0, 1, 30), 500, s) for s in range(200)]
    assert 0.02 < np.mean(np.array(p_null) < 0.05) < 0.1  # about alpha under the null
    assert stats.sign_flip_pvalue(np.zeros(5), 100, 0) == 1.0


def test_summary():
    s = stats.summary(np.arange(1, 6, dtype=float))
    assert (s["median"], s["q1"], s["q3"], s["iqr"]) == (3.0, 2.0, 4.0, 2.0)


@pytest.mark.parametrize("lo,hi,least,most,verdict", [
    (0.6, 0.8, 0.5, None, PASS), (0.3, 0.4, 0.5, None, FAIL), (0.4, 0.6, 0.5, None, INCONCLUSIVE),
    (0.1, 0.2, None, 0.3, PASS), (0.4, 0.5, None, 0.3, FAIL), (0.2, 0.4, None, 0.3, INCONCLUSIVE),
    (float("nan"), 0.5, 0.1, None, INCONCLUSIVE),
])
def test_threshold_verdicts(lo, hi, least, most, verdict):
    assert threshold_verdict(lo, hi, least, most)[0] == verdict


# ---------------------------------------------------------------- the sequential beat test
def _simulate(p: float, runs: int, max_draws: int = 100, alpha: float = 0.05, seed: int = 0):
    from harness.stats import sequential_beat_test

    rng = np.random.default_rng(seed)
    return [sequential_beat_test(lambda m: (rng.random(m) < p).tolist(), max_draws, 0.5, alpha) for _ in range(runs)]


def test_sequential_beat_test_keeps_its_error_rates_by_simulation():
    """At the boundary p = rate (the hardest null for both errors) neither wrong decision exceeds
    alpha, although the test looks after 8, 16, 32, 64 and 100 draws; 4000 simulated sequences, so a
    rate of 0.05 would show as 0.05 +- 0.0034 (one s.e.)."""
    tests = _simulate(0.5, 4000)
    more = np.mean([t.decision == "more" for t in tests])
    not_more = np.mean([t.decision == "not more" for t in tests])
    assert more <= 0.05 and not_more <= 0.05
    assert all(t.looks == (8, 16, 32, 64, 100)[:len(t.looks)] for t in tests)
    assert all((t.decision == "more") == (t.p_value <= 0.05) for t in tests)  # the p-value is the LR's bound


def test_sequential_beat_test_stops_early_when_the_answer_is_clear():
    """A circuit that beats every random one is decided after the first 8 draws; one that beats 90%
    of them within 32 draws nearly always; one at 10% is decided "not more" as fast."""
    from harness.stats import beat_likelihood_ratio, sequential_beat_test

    t = sequential_beat_test(lambda m: [True] * m, 100, 0.5, 0.05)
    assert (t.decision, t.drawn, t.beaten) == ("more", 8, 8) and t.stopped_early
    assert beat_likelihood_ratio(8, 8, 0.5) == pytest.approx((1 - 0.5 ** 9) / 9 / 0.5 / 0.5 ** 8)
    good = _simulate(0.9, 500, seed=1)
    assert np.mean([x.decision == "more" for x in good]) > 0.98 and np.median([x.drawn for x in good]) <= 16
    bad = _simulate(0.1, 500, seed=2)
    assert np.mean([x.decision == "not more" for x in bad]) > 0.98 and np.median([x.drawn for x in bad]) <= 16
    edge = sequential_beat_test(lambda m: [False] * m, 100, 0.0, 0.05)  # nothing is below a rate of 0
    assert edge.decision != "not more"
