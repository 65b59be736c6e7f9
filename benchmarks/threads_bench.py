"""Benchmark behind harness.threads: small linear algebra and a large matrix
product on one thread and on every available core, on an idle machine and
while a competing torch process (two threads of small QRs) runs.

    .venv/bin/python benchmarks/threads_bench.py [--seconds 40]

Prints one line per (load, threads) with the times of 200 QRs of 120 x 48
matrices (what the old composition null did), 500 Cholesky factorisations of
64 x 64 matrices (what the shared null does), and 20 products of a
2050 x 768 by 768 x 3072 matrix (one GPT-2-small MLP layer on 50 prompts of 41
tokens), then the ratios many-threads / one-thread under load.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time

from harness.threads import available_cores

_WORK = """
import sys, time, torch
torch.set_num_threads(int(sys.argv[1]))
g = torch.Generator().manual_seed(0)
def timed(f, k):
    t = time.perf_counter()
    for _ in range(k):
        f()
    return time.perf_counter() - t
qr = timed(lambda: torch.linalg.qr(torch.randn(120, 48, generator=g, dtype=torch.float64)), 200)
x = torch.randn(8, 64, 64, dtype=torch.float64)
spd = x @ x.mT + torch.eye(64, dtype=torch.float64)
chol = timed(lambda: torch.linalg.cholesky(spd), 500)
a, w = torch.randn(2050, 768), torch.randn(768, 3072)
mm = timed(lambda: a @ w, 20)
print(f"{qr:.3f} {chol:.3f} {mm:.3f}")
"""

_COMPETITOR = """
import time, torch
torch.set_num_threads(2)
a = torch.randn(64, 64, dtype=torch.float64)
end = time.time() + float(__import__("sys").argv[1])
while time.time() < end:
    torch.linalg.qr(a)
"""


def measure(n_threads: int) -> tuple[float, float, float]:
    out = subprocess.run([sys.executable, "-c", _WORK, str(n_threads)], capture_output=True, text=True, check=True)
    qr, chol, mm = (float(v) for v in out.stdout.split())
    return qr, chol, mm


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--seconds", type=float, default=40.0, help="how long the competing process runs")
    args = p.parse_args(argv)
    many = max(2, available_cores())
    results = {}
    for load in ("idle", "busy"):
        competitor = None
        if load == "busy":
            competitor = subprocess.Popen([sys.executable, "-c", _COMPETITOR, str(args.seconds)])
            time.sleep(2.0)
        try:
            for n in (1, many):
                results[(load, n)] = measure(n)
                qr, chol, mm = results[(load, n)]
                print(f"{load:4} threads={n}: 200 QR 120x48 {qr:7.3f} s   500 Cholesky 64x64 {chol:6.3f} s   "
                      f"20 matmul 2050x768x3072 {mm:6.3f} s", flush=True)
        finally:
            if competitor is not None:
                competitor.kill()
                competitor.wait()
    b1, bn = results[("busy", 1)], results[("busy", many)]
    print(f"busy, {many} threads / 1 thread: QR {bn[0] / b1[0]:.1f}x, Cholesky {bn[1] / b1[1]:.1f}x, "
          f"matmul {bn[2] / b1[2]:.2f}x (above 1: slower with more threads)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
