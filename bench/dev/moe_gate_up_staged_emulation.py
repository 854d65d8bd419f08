# bench/dev/moe_gate_up_staged_emulation.py: host emulation of the index math of wide_gate_up_staged_kernel
# (bench/dev/moe_gate_up_staged.patch): every item computed once by one block, a DownRef a pair, and each
# staged unit's (row, vector) code word, scale and zero the source's, for grids of 1 / 7 / 132 blocks and
# 2 / 4 stages. Run: python3 bench/dev/moe_gate_up_staged_emulation.py (prints ok per shape; ~1 min).
import itertools, random
def run(H, I, gs, T, k, grid, S=4, W=8, threads=256):
    nvec = H // 32; gshift = {32:0,64:1,128:2,256:3}[gs]; G = nvec >> gshift
    nrb = I // 32; items = T * k * nrb; RU = 32 // W
    # source: expert e, matrix m (0 gate, 1 up): codes[row][v] = ('c', e, m, row, v); scales[row][g]; zeros[row][g]
    E = 7; ids = [random.randrange(E) for _ in range(T * k)]
    ncodes = 32 * nvec; nscales = 32 * G * 2 // 16; nzeros = 32 * G // 16
    assert 32 * G * 2 % 16 == 0 and 32 * G % 16 == 0
    seen = {}; downs = {}
    for b in range(grid):
        mine = (items - b + grid - 1) // grid; units = 2 * mine
        src = []
        for j in range(mine):
            it = b + j * grid; p, rb = divmod(it, nrb)
            if rb == 0: downs[p] = downs.get(p, 0) + 1
            for m in (0, 1): src.append((ids[p], m, rb * 32))
        stages = [None] * S
        def issue(u):
            if u < units:
                e, m, r0 = src[u]; st = {}
                for c0 in range(threads):
                    for c in range(c0, ncodes + nscales + nzeros, threads):
                        if c < ncodes:   # chunk c of the rows' codes: row r0 + c // nvec, vector c % nvec
                            st[('c', c)] = ('c', e, m, r0 + c // nvec, c % nvec)
                        elif c < ncodes + nscales:  # 16 bytes = 8 fp16 scales
                            for q in range(8):
                                s_idx = (c - ncodes) * 8 + q; st[('s', s_idx)] = ('s', e, m, r0 + s_idx // G, s_idx % G)
                        else:
                            for q in range(16):
                                z_idx = (c - ncodes - nscales) * 16 + q; st[('z', z_idx)] = ('z', e, m, r0 + z_idx // G, z_idx % G)
                stages[u % S] = (u, st)
        for u in range(S - 1): issue(u)
        for u in range(units):
            issue(u + S - 1)
            j = u >> 1; it = b + j * grid; p, rb = divmod(it, nrb)
            assert stages[u % S][0] == u, "stage holds another unit"
            st = stages[u % S][1]; e, m, r0 = src[u]
            assert e == ids[p] and r0 == rb * 32 and m == (u & 1)
            for warp in range(W):
                for lane in range(32):
                    for i in range(4):
                        v = lane + 32 * i
                        if v >= nvec: break
                        for r in range(RU):
                            row = warp * RU + r; gi = row * G + (v >> gshift)
                            assert st[('c', row * nvec + v)] == ('c', e, m, rb * 32 + row, v)
                            assert st[('s', gi)] == ('s', e, m, rb * 32 + row, v >> gshift)
                            assert st[('z', gi)] == ('z', e, m, rb * 32 + row, v >> gshift)
            if u & 1: seen[it] = seen.get(it, 0) + 1
    assert sorted(seen) == list(range(items)) and all(n == 1 for n in seen.values()), "every item once"
    assert sorted(downs) == list(range(T * k)) and all(n == 1 for n in downs.values()), "a DownRef a pair"
    return items
random.seed(1)
for (H, I, gs, T, k) in [(1088, 160, 32, 8, 5), (2048, 512, 128, 2, 8), (4096, 2048, 64, 2, 2), (256, 96, 32, 3, 2)]:
    for grid in (1, 7, 132):
        items = T * k * (I // 32)
        g = min(grid, items)
        for S in (2, 4):
            run(H, I, gs, T, k, g, S=S)
    print("ok", H, I, gs, T, k)
