"""Task 7's decode plan before and after the leaner one (fourteenth session): transformers'
models on our kernels, the left-padded batch (task7.models' "padded" case), fp16, TBT over 40
tokens, the plan of before (copied below, as it was at 78d1235) and of after (task7/hf_attention.py)
patched in turn, beside the reference implementation (sdpa, or eager for Gemma-2 and GPT-OSS),
5 interleaved rounds, one process; greedy tokens of before and after compared.
    PYTHONPATH=. python results/logs/h100_s14_hf_plan/plan_ab.py   (writes $OUT/plan_ab.json)
"""
import json, os, statistics, time
import torch
from task7 import hf_attention, models as M
from task7.hf_attention import MASKED_BELOW, NAME, Plan, _as_4d, _keep_candidates

OUT = os.environ.get("OUT", ".")
ROUNDS = int(os.environ.get("AB_ROUNDS", "5"))
TOKENS = 40
DEVICE = os.environ.get("PLAN_AB_DEVICE", "cuda")


# ---- the plan of before (task7/hf_attention.py at 78d1235) ----------------------------------
def _plan_decode_before(keep, seen, begin, end, batch: int, seq_k: int) -> Plan:
    """One query row per sequence (a decode step), bool mask: fewer device ops than the
    general candidates. The row is structured iff its visible keys are one contiguous range
    ending at the last key (left padding; causal and any window only shorten the range) or
    starting at key 0 (a static cache's filled prefix), the same for every head."""
    count = seen.sum(dim=-1)
    contiguous = (count == end - begin) | (count == 0)
    same_heads = ((keep == keep[:, :1]).all() if keep.shape[1] > 1
                  else torch.ones((), dtype=torch.bool, device=keep.device))
    flags = torch.stack([same_heads, (contiguous & ((end == seq_k) | (count == 0))).all(),
                         (contiguous & (begin == 0)).all(), (begin == 0).all(),
                         (end == seq_k).all()]).tolist()      # the one host read
    heads_ok, left_ok, right_ok, all_begin0, all_end_sk = flags
    if heads_ok and (left_ok or right_ok):
        if left_ok:
            lengths = None if all_begin0 else (seq_k - begin)
        else:
            lengths = None if all_end_sk else end
        kl = None if lengths is None else lengths.to(torch.int32).expand(batch).contiguous()
        return Plan("structured", causal=True, key_lengths=kl,
                    left_padding=bool(left_ok) and kl is not None,
                    reason="decode mask is one key range")
    lengths = None if all_begin0 else (seq_k - begin).to(torch.int32).expand(batch).contiguous()
    return Plan("mask", causal=True, mask=keep, key_lengths=lengths,
                left_padding=lengths is not None, reason="keep/drop mask with no structured pattern")


def plan_from_mask_before(mask: torch.Tensor, query: torch.Tensor, key: torch.Tensor) -> Plan:
    """What a given mask allows (one host read). mask: bool or float, broadcastable to
    [B, H_q, Sq, Sk] after its last dimension is cut to Sk (older transformers pass longer)."""
    batch, heads, seq_q = query.shape[:3]
    seq_k = key.shape[2]
    if mask.shape[-1] < seq_k:
        return Plan("fallback", reason="mask shape")
    mask = _as_4d(mask[..., :seq_k])
    try:
        torch.broadcast_shapes(mask.shape, (batch, heads, seq_q, seq_k))
    except RuntimeError:
        return Plan("fallback", reason="mask shape")
    if mask.shape[0] not in (1, batch) or mask.shape[2] not in (1, seq_q):
        return Plan("fallback", reason="mask shape")
    if mask.dtype == torch.bool:
        keep, keep_drop = mask, None
    elif mask.is_floating_point():
        keep = mask == 0
        keep_drop = (keep | (mask <= MASKED_BELOW)).all()
    else:
        return Plan("fallback", reason=f"mask dtype {str(mask.dtype).replace('torch.', '')}")

    b = keep.shape[0]
    seen = keep.any(dim=2).any(dim=1)                 # [b, Sk]: keys some row of b sees
    any_seen = seen.any(dim=-1)
    begin = torch.where(any_seen, seen.to(torch.uint8).argmax(dim=-1), seq_k)
    end = torch.where(any_seen, seq_k - seen.flip(-1).to(torch.uint8).argmax(dim=-1), 0)
    if seq_q == 1 and keep_drop is None:
        return _plan_decode_before(keep, seen, begin, end, batch, seq_k)
    width = keep.sum(dim=-1).amax()
    candidates = list(_keep_candidates(b, seq_q, seq_k, begin, end, width))
    flags = [(cand == keep).all() for *_, cand in candidates]
    # Which causal/key-range the mask at least lies within, for the mask route's tile skipping.
    causal_left = candidates[0][3]
    within_causal = ~(keep & ~causal_left).any()
    full_left = (begin == 0).all()
    full_right = (end == seq_k).all()
    extra = [within_causal, full_left, full_right, width]
    if keep_drop is not None:
        extra.append(keep_drop)
    verdict = torch.stack([f.to(torch.int64) for f in flags] + [e.to(torch.int64) for e in extra])
    verdict = verdict.tolist()                        # the one host read
    n = len(flags)
    within, all_begin0, all_end_sk, widest = verdict[n:n + 4]
    is_keep_drop = bool(verdict[n + 4]) if keep_drop is not None else True

    def lengths(left: bool) -> torch.Tensor | None:
        if (all_begin0 if left else all_end_sk):
            return None
        values = (seq_k - begin) if left else end
        return values.to(torch.int32).expand(batch).contiguous()

    if is_keep_drop:
        for ok, (causal, left, windowed, _) in zip(verdict[:n], candidates, strict=True):
            if not ok:
                continue
            window = int(widest) if windowed else 0
            if windowed and (window < 1 or window >= seq_k):
                continue       # the window hides nothing the other candidates would not
            kl = lengths(left)
            return Plan("structured", causal=causal, window=window, key_lengths=kl,
                        left_padding=left and kl is not None,
                        reason="mask is exactly this pattern")
        # The kernel ANDs everything it is given: the causal triangle and the key range the
        # mask lies in are exact, and let it skip the tiles the mask leaves empty.
        kl = lengths(True)
        return Plan("mask", causal=bool(within), mask=keep, key_lengths=kl,
                    left_padding=kl is not None,
                    reason="keep/drop mask with no structured pattern")
    # A real bias: the kernel adds it to the scaled scores (-inf drops a key).
    bias = mask if mask.dtype in (torch.float32, query.dtype) else mask.float()
    return Plan("mask", mask=bias, reason="additive float bias")


PLANS = {"before": plan_from_mask_before, "after": hf_attention.plan_from_mask}


def run(model, ids, mask, arm, reference):
    if arm == "reference":
        out = M._generate(model, ids, mask, TOKENS, reference, logits=False)
    else:
        hf_attention.plan_from_mask = PLANS[arm]
        hf_attention._cache.clear()
        try:
            out = M._generate(model, ids, mask, TOKENS, NAME, logits=False)
        finally:
            hf_attention.plan_from_mask = PLANS["after"]
    return out[0], statistics.median(out[2].step_ms)


res = {"device": torch.cuda.get_device_name() if DEVICE == "cuda" else "cpu", "torch": torch.__version__,
       "commit": os.environ.get("ATTN_COMMIT"), "what": __doc__, "models": {}}
t0 = time.time()
for name in os.environ.get("PLAN_AB_MODELS", ",".join(M.MODELS)).split(","):
    model = M.build_model(name, device=DEVICE, dtype=torch.float16 if DEVICE == "cuda" else torch.float32)
    ids, mask = M.prompts("padded", DEVICE, model.config.vocab_size)
    reference = M.reference_attention(name)
    arms = ("reference", "before", "after")
    tokens = {}
    for arm in arms:                                   # warm-up (and every shape seen once)
        tokens[arm], _ = run(model, ids, mask, arm, reference)
        run(model, ids, mask, arm, reference)
    tbt = {arm: [] for arm in arms}
    for _ in range(ROUNDS):
        for arm in arms:
            tbt[arm].append(run(model, ids, mask, arm, reference)[1])
    med = {arm: statistics.median(v) for arm, v in tbt.items()}
    same = bool(torch.equal(tokens["before"], tokens["after"]))
    res["models"][name] = {"tbt_ms": tbt, "median_ms": med, "tokens_before_equal_after": same,
                           "reference": reference}
    print(f"{name:8s} padded fp16: {reference} {med['reference']:.3f} ms, before {med['before']:.3f} ms "
          f"({med['reference'] / med['before']:.2f}x), after {med['after']:.3f} ms "
          f"({med['reference'] / med['after']:.2f}x); tokens before = after: {same}", flush=True)
    del model
    if DEVICE == "cuda":
        torch.cuda.empty_cache()
print(f"{time.time() - t0:.0f} s")
json.dump(res, open(os.path.join(OUT, "plan_ab.json"), "w"), indent=1)
