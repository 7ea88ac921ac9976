#!/usr/bin/env python3
"""Design measurement behind e8p:2's codebook (BENCHMARKS.md, "Low-rate formats a GPU decodes").

Compares 2^16-point 8-dimensional codebooks on 4096 N(0,1) blocks at the best of 15 global scales
(0.6 .. 1.3), by brute-force nearest point:
  ball   the 2^16 smallest-norm points of E8 (e8:2's codebook, ties in enumeration order)
  none   sign x pattern + 1/4 shift over the 227 absolute-value patterns of D8 + 1/2 with sum a^2 <= 10
  55+all3, six3+all3, five3   the same plus 29 more patterns: (5/2, 5/2, 1/2^6) + (3/2^8) is e8p:2's choice

Usage: python3 bench/e8p_design.py [ball|none|55+all3|six3+all3|five3]...  (numpy; ~1 min per codebook)
"""
import itertools
import sys

import numpy as np


def orbit(c):
    return sorted(set(itertools.permutations(c)))


def base_patterns():
    pats = []
    for combo in itertools.combinations_with_replacement([1, 3, 5, 7], 8):  # doubled absolute values
        if sum(c * c for c in combo) <= 40:
            pats += orbit(combo)
    assert len(pats) == 227
    return pats


def signed_shifted(pats):
    pts = []
    for a in np.array(pats, float) / 2:
        par = int(round(np.sum(a - 0.5))) % 2
        for m in range(256):
            if bin(m).count("1") % 2 != par:
                continue
            s = np.array([-1.0 if (m >> i) & 1 else 1.0 for i in range(8)])
            for sh in (-0.25, 0.25):
                pts.append(s * a + sh)
    return np.array(pts)


def e8_ball():
    pts = [p for p in itertools.product(range(-3, 4), repeat=8) if sum(p) % 2 == 0 and sum(v * v for v in p) <= 12]
    pts += [p for p in itertools.product([-2.5, -1.5, -0.5, 0.5, 1.5, 2.5], repeat=8)
            if (sum(p) - 4) % 2 == 0 and sum(v * v for v in p) <= 12]
    P = np.array(pts, float)
    return P[np.argsort((P * P).sum(1), kind="stable")[:65536]]


EXTRA = {"six3": orbit((1, 1, 3, 3, 3, 3, 3, 3)), "55": orbit((1, 1, 1, 1, 1, 1, 5, 5)), "all3": [(3,) * 8],
         "five3": orbit((1, 1, 1, 3, 3, 3, 3, 3)), "none": []}


def snr(C, X, scales):
    Cn = (C * C).sum(1)
    best = np.inf
    for s in scales:
        Y = X / s
        tot = 0.0
        for i in range(0, len(Y), 1024):
            y = Y[i:i + 1024]
            tot += ((y * y).sum(1)[:, None] - 2 * y @ C.T + Cn[None, :]).min(1).sum() * s * s
        best = min(best, tot / X.size)
    return -10 * np.log10(best)


def main():
    X = np.random.default_rng(1).standard_normal((4096, 8))
    scales = np.linspace(0.6, 1.3, 15)
    for which in sys.argv[1:] or ["ball", "none", "55+all3"]:
        if which == "ball":
            C = e8_ball()
        else:
            extra = []
            for name in which.split("+"):
                extra += EXTRA[name]
            C = signed_shifted(base_patterns() + extra[:29])
        print("%-10s %6d points  SNR %.2f dB" % (which, len(C), snr(C, X, scales)))


if __name__ == "__main__":
    main()
