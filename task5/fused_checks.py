"""The fused decode kernels (task5/fused.py): checks and timings. Groups of `python -m task5.test`:

  fused-small   one tiny case of each kernel and dtype (compute-sanitizer)
  fused         each kernel against float64 by FlashAttention-2's criterion (its error at most
                2x that of its PyTorch twin computed in the same dtype, + 1e-5): the norms
                (LayerNorm, RMSNorm, with and without the residual add; rows 1..300; hidden
                64..8192; inputs with a large common offset, where a one-pass variance
                cancels), RoPE + cache append (fp32 bit-identical to task 6's apply_rope and
                the cache write; GQA; per-sequence position tensors; a position outside the
                cache writes nothing; CUDA-graph replays while the position advances), SwiGLU
                on the stacked gate/up weight (1..8 rows, bias, residual, each split of K);
                every kernel run twice on NaN-poisoned outputs must give the same bits; bad
                input raises a sentence. Then each kernel and its PyTorch twin timed at task
                6's decode shapes (B 4, hidden 4096, 32 heads, width 16384) as CUDA-graph
                replays.
"""

from __future__ import annotations

import itertools

import torch

from common.checks import Check, check_raises
from common.graphs import graph_time_per_call_ms
from common.harness import gpu_group
from common.limits import DECODE_LINEAR_K_SPLITS
from common.rope import rope_tables
from task5 import fused
from task5.ops import torch_ops

DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}
ABS_MARGIN = 1e-5


def _criterion(name: str, ours: torch.Tensor, twin: torch.Tensor, truth: torch.Tensor) -> Check:
    """FlashAttention-2's test: max|ours - truth| <= 2 max|twin - truth| + 1e-5."""
    if not torch.isfinite(ours).all():
        return Check(name, False, "NaN/Inf in the output: an element never written?")
    err = (ours.double() - truth).abs().max().item()
    twin_err = (twin.double() - truth).abs().max().item()
    ok = err <= 2 * twin_err + ABS_MARGIN
    return Check(name, ok, f"max err {err:.2e} (PyTorch in the same dtype {twin_err:.2e})")


def _same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    return torch.equal(a.contiguous().view(torch.uint8), b.contiguous().view(torch.uint8))


# --- norms ---------------------------------------------------------------------------------

def _norm_case(rows, hidden, dtype, rms, residual, offset, gen, device) -> list[Check]:
    def rand(*shape, scale=1.0, shift=0.0):
        return (torch.randn(*shape, device=device, generator=gen) * scale + shift).to(dtype)

    x = rand(rows, hidden, shift=offset)
    r = rand(rows, hidden) if residual else None
    w, b = rand(hidden, scale=0.5, shift=1.0), None if rms else rand(hidden)
    name = (f"{'rms' if rms else 'layer'}_norm {dtype} rows {rows} hidden {hidden}"
            + (" + residual" if residual else "") + (f" offset {offset:g}" if offset else ""))
    runs = [fused.add_norm(x, w, b, 1e-5, r, rms) for _ in range(2)]
    twin = torch_ops().add_norm(x, w, b, 1e-5, r, rms)
    h64 = x.double() if r is None else (x + r).double()   # the residual stream, as the dtype holds it
    shape = (hidden,)
    truth = (torch.nn.functional.rms_norm(h64, shape, w.double(), 1e-5) if rms else
             torch.nn.functional.layer_norm(h64, shape, w.double(), None if b is None else b.double(), 1e-5))
    out0, out1 = (run if r is None else run[0] for run in runs)
    twin_out = twin if r is None else twin[0]
    checks = [_criterion(name, out0, twin_out, truth)]
    same = _same_bits(out0, out1)
    if r is not None:
        same = same and _same_bits(runs[0][1], runs[1][1])
        checks.append(Check(f"{name}: x + residual returned", torch.equal(runs[0][1], x + r)))
    checks.append(Check(f"{name}: two runs bit-identical", same))
    return checks


def _norm_checks(small: bool, device, gen) -> list[Check]:
    checks = []
    cases = ([(2, 64, False, 0.0)] if small else
             [(1, 4096, False, 0.0), (4, 4096, True, 0.0), (7, 1000, False, 0.0), (300, 512, True, 0.0),
              (4, 8192, False, 0.0), (3, 64, True, 0.0), (4, 4096, False, 300.0)])
    for dtype in DTYPES.values():
        for rows, hidden, residual, offset in cases:
            for rms in (False, True):
                checks += _norm_case(rows, hidden, dtype, rms, residual, offset, gen, device)
    # A row the kernel does not take (hidden 6: not 16-byte pieces) goes to the twin.
    x, w = torch.randn(3, 6, device=device), torch.ones(6, device=device)
    checks.append(Check("layer_norm hidden 6: the PyTorch fallback",
                        torch.equal(fused.add_norm(x, w), torch_ops().add_norm(x, w))))
    return checks


# --- RoPE + cache append -------------------------------------------------------------------

def _rope64(x, cos, sin, positions):
    """x [B, S, H, D] rotated in float64 at positions [B, S] (fp32 tables, exact products)."""
    half = x.shape[-1] // 2
    c, s = cos[positions].double()[:, :, None, :], sin[positions].double()[:, :, None, :]
    x64 = x.double()
    rotated = torch.cat((-x64[..., half:], x64[..., :half]), dim=-1)
    return x64 * c + rotated * s


def _rope_case(batch, seq, q_heads, kv_heads, head_dim, dtype, position, gen, device,
               max_len=64) -> list[Check]:
    def rand(*shape):
        return torch.randn(*shape, device=device, generator=gen).to(dtype)

    # q, k, v as views of one projection output [B, S, (Hq + 2 Hkv) * D], as the model has them.
    qkv = rand(batch, seq, q_heads + 2 * kv_heads, head_dim)
    q, k, v = qkv[:, :, :q_heads], qkv[:, :, q_heads:q_heads + kv_heads], qkv[:, :, q_heads + kv_heads:]
    cos, sin = rope_tables(head_dim, max_len, device=device)
    label = (f"rope_append {dtype} B {batch} S {seq} Hq {q_heads} Hkv {kv_heads} D {head_dim} "
             f"pos {position.tolist() if isinstance(position, torch.Tensor) else position}")
    caches = [[torch.full((batch, max_len, kv_heads * head_dim), float("nan"), dtype=dtype,
                          device=device) for _ in range(2)] for _ in range(3)]
    outs = [fused.rope_append(q, k, v, *caches[i], cos, sin, position) for i in range(2)]
    starts = (position.to(device).long().reshape(-1).expand(batch) if isinstance(position, torch.Tensor)
              else torch.full((batch,), position, device=device))
    positions = starts[:, None] + torch.arange(seq, device=device)[None, :]
    q64 = _rope64(q, cos, sin, positions)
    checks = [Check(f"{label}: two runs bit-identical",
                    _same_bits(outs[0], outs[1]) and all(_same_bits(a, b) for a, b in zip(caches[0], caches[1])))]
    one_position = not isinstance(position, torch.Tensor) or position.dim() == 0
    if one_position:   # the twin takes one position for the batch (as task 6 uses it)
        twin_q = torch_ops().rope_append(q, k, v, *caches[2], cos, sin, position)
        if dtype == torch.float32:
            same = _same_bits(outs[0], twin_q) and all(_same_bits(a, b) for a, b in zip(caches[0], caches[2]))
            checks.append(Check(f"{label}: fp32 equals apply_rope + the cache write bit for bit", same))
    else:              # the yardstick is then the truth rounded to the dtype
        twin_q = q64.to(dtype)
    checks.append(_criterion(f"{label}: q", outs[0], twin_q, q64))
    k64 = _rope64(k, cos, sin, positions)
    written = torch.zeros(batch, max_len, dtype=torch.bool, device=device)
    written[torch.arange(batch, device=device)[:, None], positions] = True
    k_rows = caches[0][0].view(batch, max_len, kv_heads, head_dim)[written].view(batch, seq, kv_heads, head_dim)
    v_rows = caches[0][1].view(batch, max_len, kv_heads, head_dim)[written].view(batch, seq, kv_heads, head_dim)
    k_err = (k_rows.double() - k64).abs().max().item()
    ulp = torch.finfo(dtype).eps
    checks.append(Check(f"{label}: k rotated into the cache", k_err <= 4 * ulp * k64.abs().max().item() + 1e-6,
                        f"max err {k_err:.2e}"))
    checks.append(Check(f"{label}: v copied into the cache", torch.equal(v_rows, v)))
    untouched = torch.isnan(caches[0][0][~written]).all() and torch.isnan(caches[0][1][~written]).all()
    checks.append(Check(f"{label}: no other cache row written", bool(untouched)))
    return checks


def _rope_out_of_range(device) -> Check:
    """A device position past the cache (not checkable on the host) writes nothing, q = 0."""
    q = torch.randn(2, 1, 4, 32, device=device)
    k = v = torch.randn(2, 1, 2, 32, device=device)
    caches = [torch.zeros(2, 8, 64, device=device) for _ in range(2)]
    cos, sin = rope_tables(32, 8, device=device)
    out = fused.rope_append(q, k, v, *caches, cos, sin, torch.tensor([3, 8], dtype=torch.int32, device=device))
    ok = (not out[1].any() and out[0].abs().sum() > 0 and not caches[0][1].any()
          and caches[0][0, 3].abs().sum() > 0)
    return Check("rope_append: a position past the cache writes nothing, q zeros", bool(ok))


def _rope_graph(device) -> Check:
    """Captured once, replayed while the position advances: each replay equals an eager call."""
    from common.graphs import capture_graph

    gen = torch.Generator(device=device).manual_seed(0)
    q = torch.randn(2, 1, 4, 64, device=device, generator=gen, dtype=torch.bfloat16)
    k = torch.randn(2, 1, 2, 64, device=device, generator=gen, dtype=torch.bfloat16)
    v = torch.randn(2, 1, 2, 64, device=device, generator=gen, dtype=torch.bfloat16)
    cos, sin = rope_tables(64, 16, device=device)
    graph_caches = [torch.zeros(2, 16, 128, device=device, dtype=torch.bfloat16) for _ in range(2)]
    eager_caches = [torch.zeros_like(c) for c in graph_caches]
    position = torch.tensor(0, dtype=torch.int32, device=device)

    def step():
        return fused.rope_append(q, k, v, *graph_caches, cos, sin, position)

    graph, out = capture_graph(step, reset=lambda: position.fill_(0))
    ok = True
    for pos in range(5):
        position.fill_(pos)
        graph.replay()
        eager = fused.rope_append(q, k, v, *eager_caches, cos, sin, pos)
        ok = ok and torch.equal(out, eager)
    ok = ok and all(torch.equal(a, b) for a, b in zip(graph_caches, eager_caches))
    return Check("rope_append: CUDA-graph replays at positions 0..4 equal eager calls", bool(ok))


def _rope_checks(small: bool, device, gen) -> list[Check]:
    checks = []
    cases = ([(2, 1, 2, 2, 16, 5)] if small else
             [(4, 1, 32, 32, 128, 37), (2, 1, 8, 2, 128, 0), (3, 7, 4, 1, 64, 11), (1, 1, 2, 2, 8, 63),
              (2, 13, 6, 3, 80, 20)])
    for dtype in DTYPES.values():
        for batch, seq, hq, hkv, d, pos in cases:
            checks += _rope_case(batch, seq, hq, hkv, d, dtype, pos, gen, device)
            if not small:
                tensor = torch.tensor(pos, dtype=torch.int32, device=device)
                checks += _rope_case(batch, seq, hq, hkv, d, dtype, tensor, gen, device)
    if not small:
        per_seq = torch.tensor([0, 9, 40], dtype=torch.int32, device=device)
        checks += _rope_case(3, 2, 4, 2, 64, torch.bfloat16, per_seq, gen, device)
        checks.append(_rope_out_of_range(device))
        checks.append(_rope_graph(device))
    return checks


# --- SwiGLU ----------------------------------------------------------------------------------

def _swiglu_checks(small: bool, device, gen) -> list[Check]:
    checks = []
    cases = [(2, 64, 32, False, False)] if small else [
        (4, 4096, 16384, False, False), (1, 512, 100, True, False), (8, 1024, 256, False, True),
        (3, 128, 8, True, True)]
    # k_splits: the kernel's automatic split of K (0), and each forced split on the full run.
    for dtype, k_splits in itertools.product(DTYPES.values(), (0,) if small else (0, *DECODE_LINEAR_K_SPLITS)):
        for rows, k, width, bias, residual in cases:
            def rand(*shape, scale=1.0):
                return (torch.randn(*shape, device=device, generator=gen) * scale).to(dtype)

            x, w = rand(rows, k), rand(2 * width, k, scale=k ** -0.5)
            b = rand(2 * width) if bias else None
            r = rand(rows, width) if residual else None
            name = (f"decode_swiglu {dtype} rows {rows} K {k} width {width}"
                    + (" + bias" if bias else "") + (" + residual" if residual else "")
                    + (f" k_splits {k_splits}" if k_splits else ""))
            runs = [fused._ext().decode_swiglu(x, w, b, r, k_splits) for _ in range(2)]
            twin = torch_ops().decode_swiglu(x, w, b, r)
            truth = torch_ops().decode_swiglu(x.double(), w.double(), None if b is None else b.double(),
                                              None if r is None else r.double())
            checks.append(_criterion(name, runs[0], twin, truth))
            checks.append(Check(f"{name}: two runs bit-identical", _same_bits(runs[0], runs[1])))
    return checks


# --- bad input -------------------------------------------------------------------------------

def _input_checks(device) -> list[Check]:
    x = torch.randn(4, 64, device=device)
    w = torch.ones(64, device=device)
    q = torch.randn(2, 1, 4, 32, device=device)
    k = torch.randn(2, 1, 2, 32, device=device)
    caches = [torch.zeros(2, 8, 64, device=device) for _ in range(2)]
    cos, sin = rope_tables(32, 8, device=device)
    ext = fused._ext()
    cases = [
        ("add_norm: weight of the wrong size", lambda: ext.add_norm(x, None, w[:10], None, 1e-5, False), "weight"),
        ("add_norm: RMSNorm with a bias", lambda: fused.add_norm(x, w, w, rms=True), "bias"),
        ("add_norm: residual of another shape",
         lambda: ext.add_norm(x, x[:2], w, None, 1e-5, False), "residual"),
        ("add_norm: half weight for fp32 x", lambda: ext.add_norm(x, None, w.half(), None, 1e-5, False), "dtype"),
        ("rope_append: position past the cache", lambda: fused.rope_append(q, k, k, *caches, cos, sin, 8), "fit"),
        ("rope_append: cache of the wrong width",
         lambda: fused.rope_append(q, k, k, caches[0][..., :32], caches[1][..., :32], cos, sin, 0), "caches"),
        ("rope_append: half tables", lambda: fused.rope_append(q, k, k, *caches, cos.half(), sin.half(), 0), "dtype"),
        ("rope_append: odd head_dim",
         lambda: fused.rope_append(q[..., :31], k[..., :31], k[..., :31], caches[0][..., :62], caches[1][..., :62],
                                   cos[:, :31].contiguous(), sin[:, :31].contiguous(), 0), "even"),
        ("rope_append: float64 position tensor",
         lambda: fused.rope_append(q, k, k, *caches, cos, sin, torch.tensor(1.0, device=device)), "int"),
        ("decode_swiglu: odd weight rows", lambda: ext.decode_swiglu(x, torch.randn(7, 64, device=device), None, None),
         "odd"),
        ("decode_swiglu: k_splits 3",
         lambda: ext.decode_swiglu(x, torch.randn(8, 64, device=device), None, None, 3), "k_splits"),
        ("decode_linear: k_splits 8",
         lambda: ext.decode_linear(x, torch.randn(8, 64, device=device), None, None, 8), "k_splits"),
        ("decode_swiglu: 9 rows", lambda: ext.decode_swiglu(torch.randn(9, 64, device=device),
                                                            torch.randn(8, 64, device=device), None, None), "rows"),
    ]
    return [check_raises(name, fn, (ValueError, TypeError), must_mention=word) for name, fn, word in cases]


# --- timing ----------------------------------------------------------------------------------

def _timings(device, gen) -> tuple[list[Check], dict]:
    """Task 6's decode shapes (B 4, hidden 4096, 32 heads of 128, width 16384, bf16), each
    kernel and its PyTorch twin as CUDA-graph replays; several input sets rotate."""
    dtype, batch, hidden, heads, d, width, max_len = torch.bfloat16, 4, 4096, 32, 128, 16384, 1124
    metrics, checks = {}, []

    def rand(*shape):
        return torch.randn(*shape, device=device, generator=gen).to(dtype)

    cos, sin = rope_tables(d, max_len, device=device)
    pos = torch.tensor(1024, dtype=torch.int32, device=device)
    norm_sets = [(rand(batch, 1, hidden), rand(hidden), rand(hidden)) for _ in range(4)]
    qkv_sets = [rand(batch, 1, 3 * heads, d) for _ in range(4)]
    cache = [torch.zeros(batch, max_len, hidden, dtype=dtype, device=device) for _ in range(2)]
    mlp_sets = [(rand(batch, 1, hidden), rand(2 * width, hidden)) for _ in range(2)]  # 268 MB each

    def rope(ops):
        return lambda qkv: ops.rope_append(qkv[:, :, :heads], qkv[:, :, heads:2 * heads],
                                           qkv[:, :, 2 * heads:], *cache, cos, sin, pos)

    cases = {
        "layer_norm": (lambda x, w, b: fused.add_norm(x, w, b),
                       lambda x, w, b: torch_ops().add_norm(x, w, b), norm_sets),
        "rope_append": (rope(fused), rope(torch_ops()), [(t,) for t in qkv_sets]),
        "swiglu": (lambda x, w: fused.decode_swiglu(x, w), lambda x, w: torch_ops().decode_swiglu(x, w), mlp_sets),
    }
    for name, (ours, twin, sets) in cases.items():
        ours_us = graph_time_per_call_ms(ours, sets) * 1e3
        twin_us = graph_time_per_call_ms(twin, sets) * 1e3
        key = f"task5.fused.bf16.{name}"
        metrics[f"{key}.us"], metrics[f"{key}.torch_us"] = ours_us, twin_us
        checks.append(Check(f"{name} at task 6's decode shape (bf16)", True,
                            f"ours {ours_us:.1f} us, PyTorch twin {twin_us:.1f} us (CUDA-graph replays)"))
    return checks, metrics


def fused_small_group(args=None):
    device, gen, checks = gpu_group("fused-small", args)
    if device is None:
        return checks, {}
    return (_norm_checks(True, device, gen) + _rope_checks(True, device, gen)
            + _swiglu_checks(True, device, gen)), {}


def fused_group(args=None):
    device, gen, checks = gpu_group("fused", args)
    if device is None:
        return checks, {}
    checks = (_norm_checks(False, device, gen) + _rope_checks(False, device, gen)
              + _swiglu_checks(False, device, gen) + _input_checks(device))
    if all(c.passed for c in checks):
        timing_checks, metrics = _timings(device, gen)
        return checks + timing_checks, metrics
    return checks, {}


GROUPS = {"fused-small": fused_small_group, "fused": fused_group}
