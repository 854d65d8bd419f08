#!/usr/bin/env python3
"""The chunked DeltaNet prefill with the chunk terms first (gpu_core/deltanet.cu: delta_terms_kernel,
delta_wy_kernel), mirrored in float64 numpy step for step (padding of a partial chunk, 32-column state
slices) and compared with the token-by-token gated delta rule (ref::delta_rule_step). A check of the
rearranged mathematics, not of the CUDA code (the GPU tests do that):

    python3 tools/check_deltanet_wy.py     # prints the relative error per shape, exits 1 above 1e-12
"""
import sys

import numpy as np

C, SLICE = 32, 32  # kChunk, kSlice


def delta_rule(Q, K, V, g, beta, S):
    S, out = S.copy(), []
    for t in range(len(Q)):
        S = np.exp(g[t]) * S
        d = beta[t] * (V[t] - S.T @ K[t])
        S = S + np.outer(K[t], d)
        out.append(S.T @ Q[t])
    return np.array(out), S


def chunk_terms(Q, K, g, beta, t0, cc):  # delta_terms_kernel for one (chunk, value head)
    dk = K.shape[1]
    Ks, Qs = np.zeros((C, dk)), np.zeros((C, dk))
    Ks[:cc], Qs[:cc] = K[t0:t0 + cc], Q[t0:t0 + cc]
    G, Bt = np.zeros(C), np.zeros(C)
    G[:cc], Bt[:cc] = g[t0:t0 + cc], beta[t0:t0 + cc]
    G = np.cumsum(G)
    inside = np.zeros((C, C), bool)
    inside[:cc, :cc] = True
    decay = np.exp(G[:, None] - G[None, :])
    A = np.where(inside & np.tri(C, k=-1, dtype=bool), Bt[:, None] * decay * (Ks @ Ks.T), 0.0)
    M = np.where(inside & np.tri(C, dtype=bool), decay * (Qs @ Ks.T), 0.0)
    Tm = np.zeros((C, C))
    for j in range(C):  # (I + A)^-1 column by column, row after row
        for t in range(C):
            Tm[t, j] = (1.0 if t == j else 0.0) - sum(A[t, s] * Tm[s, j] for s in range(j, t))
    Wl = np.where(np.arange(C) < cc, np.exp(G[cc - 1] - G), 0.0)
    return Tm * Bt[None, :], M, np.exp(G), Wl, np.exp(G[cc - 1])


def chunked_wy(Q, K, V, g, beta, S):
    T, dk = K.shape
    dv = V.shape[1]
    chunks = [(t0, min(C, T - t0)) for t0 in range(0, T, C)]
    terms = [chunk_terms(Q, K, g, beta, t0, cc) for t0, cc in chunks]
    S, O = S.copy(), np.zeros((T, dv))
    for col0 in range(0, dv, SLICE):  # delta_wy_kernel, one block per slice
        width = min(SLICE, dv - col0)
        S0 = np.zeros((dk, SLICE))
        S0[:, :width] = S[:, col0:col0 + width]
        for (t0, cc), (Tp, M, EG, Wl, EGl) in zip(chunks, terms):
            Ks, Qs, R = np.zeros((C, dk)), np.zeros((C, dk)), np.zeros((C, SLICE))
            Ks[:cc], Qs[:cc], R[:cc, :width] = K[t0:t0 + cc], Q[t0:t0 + cc], V[t0:t0 + cc, col0:col0 + width]
            R = R - EG[:, None] * (Ks @ S0)
            D = Tp @ R
            O[t0:t0 + cc, col0:col0 + width] = (EG[:, None] * (Qs @ S0) + M @ D)[:cc, :width]
            S0 = EGl * S0 + (Wl[:, None] * Ks).T @ D
        S[:, col0:col0 + width] = S0[:, :width]
    return O, S


def main():
    rng = np.random.default_rng(0)
    worst = 0.0
    for T, dk, dv in [(2, 16, 24), (5, 64, 8), (37, 32, 32), (100, 16, 24), (300, 32, 40), (100, 128, 128)]:
        K = rng.normal(size=(T, dk))
        K /= np.linalg.norm(K, axis=1, keepdims=True)
        Q = rng.normal(size=(T, dk))
        Q /= np.linalg.norm(Q, axis=1, keepdims=True) * np.sqrt(dk)
        V = rng.normal(size=(T, dv))
        g = -np.exp(rng.normal(size=T)) * np.log1p(np.exp(rng.normal(size=T)))
        beta = 1 / (1 + np.exp(-rng.normal(size=T)))
        S = 0.1 * rng.normal(size=(dk, dv))
        O1, S1 = delta_rule(Q, K, V, g, beta, S)
        O2, S2 = chunked_wy(Q, K, V, g, beta, S)
        eo, es = np.linalg.norm(O1 - O2) / np.linalg.norm(O1), np.linalg.norm(S1 - S2) / np.linalg.norm(S1)
        worst = max(worst, eo, es)
        print(f"T {T:4d}  dk {dk:3d}  dv {dv:3d}   outputs {eo:.1e}   state {es:.1e}")
    return 0 if worst < 1e-12 else 1


if __name__ == "__main__":
    sys.exit(main())
