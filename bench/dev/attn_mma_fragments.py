#!/usr/bin/env python3
"""Checks, on the CPU, the fragment mapping of the tensor-core attention decode (attend_group_kernel in
gpu_core/attention_decode.cu; for a change to it, before a GPU runs the tests): one split of 64 cache
rows for the G query heads of a KV head, with every warp's mma.m16n8k16 emulated lane by lane from PTX's
fragment layouts (lane 4 g + q: A rows g, g + 8 at columns 2q, 2q + 1 and 2q + 8, 2q + 9; B column g at
rows 2q, 2q + 1 and 2q + 8, 2q + 9; C rows g, g + 8 at columns 2q, 2q + 1). Exactly the loads, byte
permutes and stores the kernel makes: Q's fragments in the order of a lane's 16-byte K pieces (dims 8q +
32c .. + 7), the scores' C tile into shared memory, the probabilities into the output's B fragments
(warp h, lane l: rows 2l, 2l + 1), and V^T as A from rows 2q, 2q + 1, 2q + 8, 2q + 9 of each 16-row step
at the lane's dims. Rows past the context are zeros (K, V) and -inf (scores). Float64 there: that part
checks where every value goes. Then the arithmetic: the relative L2 error of one head's output over 702
rows against float64 for the kernel's arithmetic (q in three bf16 parts: hi = bf16(x), mid = bf16(x -
hi), lo = bf16(x - hi - mid); p in two) times exact bf16 K / V rows with float32 sums, next to the
float32 kernel's it replaced (stop 54) and to q in two parts (the GPU test's bound: 2e-5).
Usage: python3 bench/dev/attn_mma_fragments.py
"""
import numpy as np

CHUNK, WARPS = 64, 8


def mma(acc, a_frags, b_frags):
    """acc[lane] += the lane's C registers of A @ B, A and B assembled from the 32 lanes' fragments."""
    a, b = np.zeros((16, 16)), np.zeros((16, 8))
    for lane in range(32):
        g, q = lane >> 2, lane & 3
        a0, a1, a2, a3 = a_frags[lane]
        a[g, 2 * q:2 * q + 2], a[g + 8, 2 * q:2 * q + 2] = a0, a1
        a[g, 2 * q + 8:2 * q + 10], a[g + 8, 2 * q + 8:2 * q + 10] = a2, a3
        b[2 * q:2 * q + 2, g], b[2 * q + 8:2 * q + 10, g] = b_frags[lane]
    d = a @ b
    for lane in range(32):
        g, q = lane >> 2, lane & 3
        acc[lane] += [d[g, 2 * q], d[g, 2 * q + 1], d[g + 8, 2 * q], d[g + 8, 2 * q + 1]]


def split(hd, group, q_heads, k_rows, v_rows, end):
    """The kernel's partial output (unnormalised, [group][hd]) and per-head max for one split."""
    kc, mt_count, vsteps = hd // 32, hd // 128, CHUNK // 16
    k_rows, v_rows = k_rows.copy(), v_rows.copy()
    k_rows[end:], v_rows[end:] = 0, 0
    zero = np.zeros(2)

    def q_pair(head, d):
        return q_heads[head, d:d + 2] if head < group else zero

    scores = np.zeros((group, CHUNK))
    for warp in range(WARPS):
        acc = np.zeros((32, 4))
        for c in range(kc):
            for h in range(2):
                a_frags, b_frags = [], []
                for lane in range(32):
                    g, q = lane >> 2, lane & 3
                    base, row = 8 * q + 32 * c + 4 * h, 8 * warp + g
                    a_frags.append((q_pair(g, base), zero, q_pair(g, base + 2), zero))
                    b_frags.append((k_rows[row, base:base + 2], k_rows[row, base + 2:base + 4]))
                mma(acc, a_frags, b_frags)
        for lane in range(32):
            g, q = lane >> 2, lane & 3
            if g < group:
                scores[g, 8 * warp + 2 * q:8 * warp + 2 * q + 2] = acc[lane, :2]
    scores[:, end:] = -np.inf
    m = scores.max(axis=1)
    p = np.exp(scores - m[:, None])
    pf = np.zeros((vsteps, 32, 2, 2))  # [step][lane][b0, b1][pair]
    for h in range(WARPS):
        for lane in range(32):
            pf[lane // 8, 4 * h + lane % 4, (lane % 8) // 4] = p[h, 2 * lane:2 * lane + 2] if h < group else 0
    out = np.zeros((group, hd))
    for warp in range(WARPS):
        acc = [np.zeros((32, 4)) for _ in range(mt_count)]
        for s in range(vsteps):
            for mt in range(mt_count):
                a_frags, b_frags = [], []
                for lane in range(32):
                    g, q = lane >> 2, lane & 3
                    d = warp * 16 * mt_count + 2 * mt_count * g + 2 * mt
                    r0, r1, r8, r9 = (v_rows[16 * s + 2 * q + i, d:d + 2] for i in (0, 1, 8, 9))
                    a_frags.append(([r0[0], r1[0]], [r0[1], r1[1]], [r8[0], r9[0]], [r8[1], r9[1]]))
                    b_frags.append((pf[s, lane, 0], pf[s, lane, 1]))
                mma(acc[mt], a_frags, b_frags)
        for lane in range(32):
            g, q = lane >> 2, lane & 3
            vdim = warp * 16 * mt_count + 2 * mt_count * g
            for j in range(2):
                if 2 * q + j < group:
                    for mt in range(mt_count):
                        out[2 * q + j, vdim + 2 * mt:vdim + 2 * mt + 2] = acc[mt][lane, j], acc[mt][lane, 2 + j]
    return out, m


def bf16(x):
    """x rounded to bf16 (nearest, ties to even), as float32."""
    bits = np.asarray(x, dtype=np.float32).view(np.uint32).astype(np.uint64)
    return (((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16) << 16).astype(np.uint32).view(np.float32)


def rounding(rng, q_rms, rows=702, hd=256, trials=30):
    """The largest relative L2 errors over `trials` heads: float32 kernel, q in two bf16 parts, in three."""
    worst = np.zeros(3)
    scale = np.float32(1 / np.sqrt(hd))
    for _ in range(trials):
        q = (rng.standard_normal(hd) * q_rms).astype(np.float32)
        k, v = bf16(rng.standard_normal((rows, hd))), bf16(rng.standard_normal((rows, hd)))
        s64 = k.astype(np.float64) @ q.astype(np.float64) * float(scale)
        p64 = np.exp(s64 - s64.max())
        want = p64 @ v.astype(np.float64) / p64.sum()
        s32 = (k @ q) * scale
        p32 = np.exp(s32 - s32.max())
        got32 = (p32 @ v) / p32.sum()
        q_hi = bf16(q)
        q_mid = bf16(q - q_hi)
        q_lo = bf16(q - q_hi - q_mid)
        got = [got32]
        for s in ((k @ q_hi) + (k @ q_mid), (k @ q_hi) + (k @ q_mid) + (k @ q_lo)):
            p = np.exp(s * scale - (s * scale).max())
            p_hi = bf16(p)
            p_lo = bf16(p - p_hi)
            got.append(((p_hi @ v) + (p_lo @ v)) / p.sum())
        worst = np.maximum(worst, [np.linalg.norm(x - want) / np.linalg.norm(want) for x in got])
    return worst


def main():
    rng = np.random.default_rng(7)
    for hd in (128, 256):
        for group in (4, 8):
            for end in (1, 37, 64):
                q_heads = rng.standard_normal((group, hd))
                k_rows, v_rows = rng.standard_normal((CHUNK, hd)), rng.standard_normal((CHUNK, hd))
                out, m = split(hd, group, q_heads, k_rows, v_rows, end)
                s = q_heads @ k_rows[:end].T
                want_m = s.max(axis=1)
                want = np.exp(s - want_m[:, None]) @ v_rows[:end]
                err = np.abs(out - want).max() / np.abs(want).max()
                ok = err < 1e-12 and np.allclose(m, want_m, rtol=1e-12, atol=0)
                print(f"hd {hd:3d}  group {group}  rows {end:2d}: {'ok' if ok else 'WRONG'} (max error {err:.1e})")
                if not ok:
                    raise SystemExit(1)
    for q_rms in (1.0, 3.0, 10.0):
        worst = rounding(rng, q_rms)
        print(f"q of rms {q_rms:2.0f}, 702 rows: largest relative L2 error float32 {worst[0]:.1e}, "
              f"q in two bf16 parts {worst[1]:.1e}, in three {worst[2]:.1e}")


if __name__ == "__main__":
    main()
