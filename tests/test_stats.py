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
