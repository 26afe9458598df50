"""Shared-memory bank model of the 2-D backward's main loop (task4/flash_backward_mma_2d.cuh).

    python .scratch/bwd_bank_model.py [--no-swizzle]   # (no torch needed)

For each tile shape (Bwd2dTile<128, 64>, <64, 128>, the general <64, 64>) and each warp, the
addresses of every shared-memory instruction of one query tile, computed from the kernel's
functions as written (SmemLayout::offset / pair_step, FragmentLanes::a_rows / b_rows / b_cols /
a_cols, the products' loops, store_score_row(_stmatrix), ScoreColumns::load_shared,
load_query_rows' lse2 / D stores, load_tile's cp.async), and from them the wavefronts:

  ldmatrix / ldmatrix.trans / stmatrix .x4: 4 phases, lanes 8i .. 8i+7 give the 8 row addresses
      (16 bytes each) of matrix i; a phase takes as many wavefronts as the most 16-byte chunks
      (distinct addresses) that fall in one 16-byte bank group, (addr >> 4) % 8 (128-byte rows
      of 32 banks x 4 bytes).
  cp.async 16 B (LDGSTS.128): 4 phases of 8 lanes, the same rule.
  LDS / STS of w bytes: 32 banks of 4 bytes, a bank serves one word per wavefront, equal words
      broadcast (one access); also the ideal, max(1, unique bytes / 128).

"ways" = the worst phase's wavefronts (1 = conflict-free); "extra" = wavefronts above the ideal,
per warp per query tile. --no-swizzle recomputes with the chunk XOR removed (the counterfactual
that shows what the model detects: 8-way conflicts in every ldmatrix phase of a 128-byte-row
tile). Also prints ncu's hardware count per warp per query tile for comparison
(results/logs/h100_backward_ncu_*).
"""
import sys
from collections import OrderedDict

SWIZZLE = "--no-swizzle" not in sys.argv


class SmemLayout:                       # flash_attention_mma.cuh, kHeadDim 64 / 128
    def __init__(self, dim):
        self.chunks, self.row_bytes, self.tile_align = dim // 8, dim * 2, 256

    def offset(self, row, chunk):
        return row * self.row_bytes + ((chunk ^ (row & 7)) if SWIZZLE else chunk) * 16

    def pair_step(self, addr, pair):
        if SWIZZLE:
            return addr ^ (pair << 5)
        return addr + (pair << 5)


class FragmentLanes:                    # flash_backward_mma_2d.cuh
    def __init__(self, layout):
        self.L = layout

    def a_rows(self, tile, row0, lane):
        return tile + self.L.offset(row0 + (lane & 15), lane >> 4)

    def b_rows(self, tile, row0, lane):
        return tile + self.L.offset(row0 + (lane & 7) + ((lane >> 4) << 3), (lane >> 3) & 1)

    def b_cols(self, tile, row0, lane):
        return tile + self.L.offset(row0 + (lane & 7) + (((lane >> 3) & 1) << 3), lane >> 4)

    def a_cols(self, tile, row0, lane):
        return self.b_rows(tile, row0, lane)


class Cfg:                              # Bwd2dTile<kHeadDim, kBlockQueries>
    def __init__(self, D, Bq):
        self.D, self.Bq, self.Bk, self.warps, self.threads = D, Bq, 128, 8, 256
        self.score_keys, self.score_queries = 128 // 4, Bq // 2
        self.score_m, self.score_n = self.score_keys // 16, self.score_queries // 8
        self.grad_keys, self.grad_cols = 128 // 4, D // 2
        self.grad_m, self.grad_n = self.grad_keys // 16, self.grad_cols // 8
        self.dq_warps_q = Bq // 32
        self.dq_cols = D // (8 // self.dq_warps_q)
        self.dq_m, self.dq_n = 2, self.dq_cols // 8
        self.rows, self.scores = SmemLayout(D), SmemLayout(Bq)
        key_tile, query_tile = 128 * self.rows.row_bytes, Bq * self.rows.row_bytes
        score_tile = 128 * self.scores.row_bytes
        self.k, self.v, self.stream = 0, key_tile, 2 * key_tile       # Bwd2dSmem
        self.stage_bytes, self.query_tile = 2 * query_tile, query_tile
        self.p_t = self.stream + 2 * self.stage_bytes
        self.ds_t = self.p_t + score_tile
        self.lse = self.ds_t + score_tile
        self.delta = self.lse + 2 * Bq * 4

    def q(self, s):
        return self.stream + s * self.stage_bytes

    def d_out(self, s):
        return self.stream + s * self.stage_bytes + self.query_tile

    def warp_blocks(self, warp):       # WarpBlocks2d
        return dict(score_key0=(warp % 4) * self.score_keys,
                    score_query0=(warp // 4) * self.score_queries,
                    grad_key0=(warp % 4) * self.grad_keys,
                    grad_col0=(warp // 4) * self.grad_cols,
                    dq_query0=(warp % self.dq_warps_q) * 32,
                    dq_col0=(warp // self.dq_warps_q) * self.dq_cols)


def chunk_phase_waves(addrs16):
    """One phase of 16-byte rows/chunks: the most distinct chunks in one 16-byte bank group."""
    groups = {}
    for a in set(addrs16):
        assert a % 16 == 0
        groups.setdefault((a >> 4) & 7, set()).add(a)
    return max(len(s) for s in groups.values())


def word_waves(addrs, width):
    """A whole-warp LDS/STS: 32 banks x 4 bytes, equal words broadcast."""
    banks = {}
    for a in set(addrs):
        for w in range(width // 4):
            word = a // 4 + w
            banks.setdefault(word % 32, set()).add(word)
    return max(len(s) for s in banks.values())


class Sites:
    def __init__(self):
        self.s = OrderedDict()

    def add(self, site, kind, waves, ideal, ways):
        n, w, i, wy = self.s.get(site, (0, 0, 0, 0))
        self.s[site] = (n + 1, w + waves, i + ideal, max(wy, ways))

    def matrix_x4(self, site, kind, lane_addr):   # ldmatrix / stmatrix .x4
        addrs = [lane_addr(l) for l in range(32)]
        per = [chunk_phase_waves(addrs[8 * i:8 * i + 8]) for i in range(4)]
        self.add(site, kind, sum(per), 4, max(per))

    def cp_async16(self, site, lane_addr):
        addrs = [lane_addr(l) for l in range(32)]
        per = [chunk_phase_waves(addrs[8 * i:8 * i + 8]) for i in range(4)]
        self.add(site, "LDGSTS.128", sum(per), 4, max(per))

    def word(self, site, kind, addrs, width):
        uniq = len(set(addrs))
        ideal = max(1, -(-uniq * width // 128))
        w = word_waves(addrs, width)
        self.add(site, kind, w, ideal, w)


def one_tile(cfg, stage=0, stmatrix=True, general=False):
    """Every shared-memory instruction of one query tile, per warp: returns Sites summed over
    the 8 warps (divide by 8 for per warp)."""
    S = Sites()
    R, Sc = FragmentLanes(cfg.rows), FragmentLanes(cfg.scores)
    rows16, srows16 = 16 * cfg.rows.row_bytes, 16 * cfg.scores.row_bytes
    qt, dot = cfg.q(stage), cfg.d_out(stage)
    for warp in range(8):
        w = cfg.warp_blocks(warp)
        # load_query_tile_2d of the next tile into the other stage: load_tile Q, dO (cp.async)
        # (kThreads / kChunks rows per step, each thread one chunk), then lse2 / D stores.
        nxt = stage ^ 1
        step = cfg.threads // cfg.rows.chunks
        for name, base in (("Q", cfg.q(nxt)), ("dO", cfg.d_out(nxt))):
            for it in range(cfg.Bq // step):
                S.cp_async16(f"cp.async {name} (load_tile)", lambda l, base=base, it=it: base + cfg.rows.offset(
                    (warp * 32 + l) // cfg.rows.chunks + it * step, (warp * 32 + l) % cfg.rows.chunks))
        for c0 in range(0, cfg.Bq, 256):
            lanes = [warp * 32 + l for l in range(32) if c0 <= warp * 32 + l < cfg.Bq]
            if lanes:
                for name, arr in (("lse2", cfg.lse), ("D", cfg.delta)):
                    S.word(f"STS.32 {name} staging", "STS", [arr + nxt * cfg.Bq * 4 + 4 * t for t in lanes], 4)
        # score_block_product: S^T (K, Q) and dP^T (V, dO)
        for name, a_tile, b_tile in (("S^T", cfg.k, qt), ("dP^T", cfg.v, dot)):
            for kk in range(cfg.D // 16):
                for mi in range(cfg.score_m):
                    S.matrix_x4(f"ldmatrix {name}: A {'K' if name == 'S^T' else 'V'} (a_rows)", "LDSM",
                                lambda l: cfg.rows.pair_step(R.a_rows(a_tile, w["score_key0"], l), kk) + mi * rows16)
                for np_ in range(cfg.score_n // 2):
                    S.matrix_x4(f"ldmatrix {name}: B {'Q' if name == 'S^T' else 'dO'} (b_rows)", "LDSM",
                                lambda l: cfg.rows.pair_step(R.b_rows(b_tile, w["score_query0"], l), kk) + np_ * rows16)
        # lse2 / D of the warp's columns (ScoreColumns::load_shared): LDS.64, once per tile,
        # or (general) per m16 row in probabilities / score_gradients
        reps = cfg.score_m if general else 1
        for _ in range(reps):
            for name, arr in (("lse2", cfg.lse), ("D", cfg.delta)):
                for j in range(cfg.score_n):
                    S.word(f"LDS.64 {name} columns", "LDS",
                           [arr + (stage * cfg.Bq + w["score_query0"] + 8 * j + 2 * (l & 3)) * 4 for l in range(32)], 8)
        # P^T and dS^T into the score tiles
        for name, tile in (("P^T", cfg.p_t), ("dS^T", cfg.ds_t)):
            for mi in range(cfg.score_m):
                key_row0 = w["score_key0"] + 16 * mi
                if stmatrix:
                    for jp in range(cfg.score_n // 2):
                        S.matrix_x4(f"stmatrix {name} (a_rows)", "STSM", lambda l: cfg.scores.pair_step(
                            Sc.a_rows(tile, key_row0, l), w["score_query0"] // 16 + jp))
                else:
                    for j in range(cfg.score_n):
                        for h in range(2):
                            addrs = []
                            for l in range(32):
                                row, col = key_row0 + (l >> 2) + 8 * h, w["score_query0"] + 8 * j + 2 * (l & 3)
                                addrs.append(tile + cfg.scores.offset(row, col >> 3) + (col & 7) * 2)
                            S.word(f"STS.32 {name} (sm_80 path)", "STS", addrs, 4)
        # gradient_block_product: dV (P^T, dO), dK (dS^T, Q)
        for name, w_tile, b_tile in (("dV", cfg.p_t, dot), ("dK", cfg.ds_t, qt)):
            w_addr = lambda l, w_tile=w_tile: Sc.a_rows(w_tile, w["grad_key0"], l)
            b_addr = lambda l, b_tile=b_tile: R.b_cols(b_tile, 0, l)
            for kk in range(cfg.Bq // 16):
                for mi in range(cfg.grad_m):
                    S.matrix_x4(f"ldmatrix {name}: A {'P^T' if name == 'dV' else 'dS^T'} (a_rows)", "LDSM",
                                lambda l: cfg.scores.pair_step(w_addr(l), kk) + mi * srows16)
                for np_ in range(cfg.grad_n // 2):
                    S.matrix_x4(f"ldmatrix.trans {name}: B {'dO' if name == 'dV' else 'Q'} (b_cols)", "LDSM.T",
                                lambda l: cfg.rows.pair_step(b_addr(l), w["grad_col0"] // 16 + np_) + kk * rows16)
        # dq_block_product_2d: dS (dS^T a_cols, .trans), K (b_cols, .trans)
        for kk in range(128 // 16):
            for mi in range(cfg.dq_m):
                S.matrix_x4("ldmatrix.trans dQ: A dS (a_cols of dS^T)", "LDSM.T",
                            lambda l: cfg.scores.pair_step(Sc.a_cols(cfg.ds_t, 0, l), w["dq_query0"] // 16 + mi) + kk * srows16)
            for np_ in range(cfg.dq_n // 2):
                S.matrix_x4("ldmatrix.trans dQ: B K (b_cols)", "LDSM.T",
                            lambda l: cfg.rows.pair_step(R.b_cols(cfg.k, 0, l), w["dq_col0"] // 16 + np_) + kk * rows16)
    return S


# ncu (H100, fp16, non-causal; l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_ld.sum), and the
# warp-tiles of each launch: CTAs x query tiles x 8 warps.
NCU = [
    ("D128 B4 H32 S4096, lse2/D per m16 row (before dce8cb5), 4-byte STS",
     "h100_backward_ncu_2d_d128.txt", 96_052_370, 4096 * 64 * 8),
    ("D128 B4 H32 S4096, lse2/D once per tile, 4-byte STS",
     "h100_backward_ncu_conflicts_2d.txt", 66_796_075, 4096 * 64 * 8),
    ("D64 B8 H32 S2048, lse2/D per m16 row (before dce8cb5)",
     "h100_backward_ncu_2d_d64.txt", 22_220_725, 4096 * 16 * 8),
    ("FA2 D128 (flash_bwd_dq_dk_dv_loop_seqk_parallel)",
     "h100_backward_ncu_conflicts_fa2.txt", 1_306_633, 4096 * 64 * 8),
    ("16-row kernel D128 (dK/dV, lse2/D LDS.64 per tile of 32 queries)",
     "h100_backward_ncu_rows_d128.txt", 519_943, 4096 * 128 * 8),
]


def main():
    print(f"swizzle: {'as written (chunk ^ row % 8)' if SWIZZLE else 'REMOVED (counterfactual)'}\n")
    total_extra = {}
    for label, cfg, general in (("D128 (Bwd2dTile<128, 64>)", Cfg(128, 64), False),
                                ("D64 (Bwd2dTile<64, 128>)", Cfg(64, 128), False),
                                ("D64 general (Bwd2dTile<64, 64>)", Cfg(64, 64), True)):
        for stm in (True, False):
            for stage in (0, 1):
                S = one_tile(cfg, stage, stm, general)
                if stage == 1:
                    continue
                print(f"{label}, {'stmatrix (sm_90)' if stm else '4-byte STS (sm_80/86/89)'}; per warp per query tile:")
                print(f"  {'access':52s} {'instr':>6s} {'waves':>7s} {'ideal':>7s} {'extra':>6s} {'ways':>5s}")
                extra_ld = 0
                for site, (n, wv, ide, ways) in S.s.items():
                    print(f"  {site:52s} {n / 8:6.2f} {wv / 8:7.2f} {ide / 8:7.2f} {(wv - ide) / 8:6.2f} {ways:5d}")
                    if site.startswith(("ldmatrix", "LDS")):
                        extra_ld += (wv - ide) / 8
                total_extra[(label, stm)] = extra_ld
                print(f"  => extra load wavefronts (ldmatrix + LDS) per warp per tile: {extra_ld:.2f}\n")
    print("ncu's hardware count of shared-load bank conflicts, per warp per query tile:")
    for label, log, count, warp_tiles in NCU:
        print(f"  {count / warp_tiles:7.2f}  {label}  ({log})")
    print(f"\nmodel ({'addresses as written' if SWIZZLE else 'swizzle removed'}), extra load wavefronts per warp and tile: "
          + ", ".join(f"{k[0].split(' (')[0]}{'' if k[1] else ' sm80'} {v:.2f}" for k, v in total_extra.items()))


if __name__ == "__main__":
    main()
