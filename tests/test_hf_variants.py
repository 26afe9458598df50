"""transformers models on our kernels (task7/hf_attention.py, task7/models.py).

CPU tests run the routing with task5.attention.attention's PyTorch twin: every model and case
with 0 fallbacks and the reference's fp32 greedy tokens (sdpa; eager for Gemma-2 and GPT-OSS,
which transformers runs on eager: softcap, sinks), continuation after a cache, the plan chosen for
each kind of mask transformers builds, and the fallback counter. GPU tests run the same on the
kernels, fp16 included.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from common.variants import Variant, reference_attention_variant
from task7 import hf_attention, models
from task7.hf_attention import course_attention_forward, plan_attention

CPU_TOKENS = models.NEW_TOKENS   # 40, as the acceptance run (each case ~0.3 s on a CPU)
needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(),
                                reason="needs an NVIDIA GPU with CUDA; none is visible to torch")


@pytest.fixture
def one_thread():
    """Tiny models: one CPU thread is faster (and steadier on a busy CI machine)."""
    saved = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(saved)


def _qkv(batch, heads_q, heads_kv, seq_q, seq_k, head_dim=32, dtype=torch.float32, seed=0):
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(batch, heads_q, seq_q, head_dim, generator=gen).to(dtype)
    k = torch.randn(batch, heads_kv, seq_k, head_dim, generator=gen).to(dtype)
    v = torch.randn(batch, heads_kv, seq_k, head_dim, generator=gen).to(dtype)
    return q, k, v


def _attend(q, k, v, mask, **kwargs):
    module = SimpleNamespace(is_causal=True, training=kwargs.pop("training", False))
    out, weights = course_attention_forward(module, q, k, v, mask, **kwargs)
    assert weights is None
    return out.transpose(1, 2)          # -> [B, H_q, Sq, D]


def _sdpa_mask(batch, q_len, kv_len, q_offset, padding, window=None, device="cpu"):
    """transformers' own mask for our name (sdpa_mask), always materialised, any >= 4.53."""
    import inspect

    masking = pytest.importorskip("transformers.masking_utils")
    kwargs = dict(batch_size=batch, kv_length=kv_len, attention_mask=padding,
                  allow_is_causal_skip=False)
    if "cache_position" in inspect.signature(masking.sdpa_mask).parameters:    # < 5.0
        kwargs["cache_position"] = torch.arange(q_offset, q_offset + q_len, device=device)
    else:
        kwargs.update(q_length=q_len, q_offset=q_offset, device=device)
    if window:
        kwargs.update(mask_function=masking.sliding_window_causal_mask_function(window),
                      local_size=window)
    return masking.sdpa_mask(**kwargs)


def _left_padding(batch_lengths, width):
    mask = torch.zeros(len(batch_lengths), width, dtype=torch.bool)
    for row, n in enumerate(batch_lengths):
        mask[row, width - n:] = True
    return mask


# --- the four models ------------------------------------------------------------------------

@pytest.mark.parametrize("case", models.CASES)
@pytest.mark.parametrize("model", models.MODELS)
def test_model_on_the_routing_cpu(model, case, one_thread):
    """0 fallbacks, sdpa's fp32 greedy tokens, and the prompt in two chunks = one pass."""
    r = models.run_case(model, case, device="cpu", new_tokens=CPU_TOKENS, fp16=False,
                        timing=False)
    assert r.fallbacks == 0 and r.chunked_fallbacks == 0, r.fallback_reasons
    assert r.routes.get("structured", 0) > 0 and "fallback" not in r.routes, r.routes
    assert r.tokens_equal, r.first_difference
    assert r.chunked_ok, f"chunked logits differ by {r.chunked_diff:.2e}"


def _kernel_contract(q, k, v, *, causal, window, mask, key_lengths, left_padding, **rest):
    """What task5.attention.attention's CUDA path accepts (checked here on the CPU, where its
    twin would accept more): window None or >= 1, key_lengths int32 [B] in [0, S_k], a bool
    or fp32/q-dtype mask broadcastable to [B, H_q, S_q, S_k], one dtype, contiguous last dims;
    softcap and scale positive floats, sinks a float [H_q] tensor on q's device, no grad."""
    batch, heads_q, seq_q, head_dim = q.shape
    seq_k = k.shape[2]
    assert window is None or (isinstance(window, int) and window >= 1), window
    assert q.dtype == k.dtype == v.dtype and head_dim % 8 == 0 and head_dim <= 256
    assert heads_q % k.shape[1] == 0 and all(t.stride(-1) == 1 for t in (q, k, v))
    if key_lengths is not None:
        assert key_lengths.dtype == torch.int32 and key_lengths.shape == (batch,)
        assert 0 <= int(key_lengths.min()) and int(key_lengths.max()) <= seq_k
    if mask is not None:
        assert mask.dtype in (torch.bool, torch.float32, q.dtype), mask.dtype
        torch.broadcast_shapes(mask.shape, (batch, heads_q, seq_q, seq_k))
        assert mask.dim() == 4
    assert set(rest) <= {"softcap", "sinks", "scale"}, rest
    assert rest.get("softcap") is None or (isinstance(rest["softcap"], float) and rest["softcap"] > 0)
    assert rest.get("scale") is None or (isinstance(rest["scale"], float) and rest["scale"] > 0)
    sinks = rest.get("sinks")
    assert sinks is None or (sinks.shape == (heads_q,) and sinks.is_floating_point()
                             and sinks.device == q.device and not sinks.requires_grad)


@pytest.mark.parametrize("model,case", [("mistral", "padded"), ("qwen2", "single"),
                                        ("gemma2", "padded"), ("gptoss", "single")])
def test_kernel_arguments_keep_the_cuda_contract(model, case, one_thread, monkeypatch):
    import task5.attention as entry

    real, seen = entry.attention, []

    def checked(q, k, v, **kwargs):
        _kernel_contract(q, k, v, **kwargs)
        seen.append(kwargs)
        return real(q, k, v, **kwargs)

    monkeypatch.setattr(entry, "attention", checked)
    r = models.run_case(model, case, device="cpu", new_tokens=6, fp16=False, timing=False)
    assert r.tokens_equal and seen
    if model == "gemma2":     # softcap 50 and query_pre_attn_scalar 224 reach the kernels
        assert all(kw["softcap"] == 50.0 and kw["scale"] == pytest.approx(224 ** -0.5)
                   for kw in seen)
    if model == "gptoss":     # every call carries its layer's sinks
        assert all(kw["sinks"].shape == (8,) for kw in seen)
    # the mask route too: a static cache of 28 holding a prompt of 21, sequence 1 padded by 6
    padded = torch.zeros(2, 28, dtype=torch.bool)
    padded[0, :21] = True
    padded[1, 6:21] = True
    q, k, v = _qkv(2, 4, 2, 21, 28)
    _attend(q, k, v, _sdpa_mask(2, 21, 28, 0, padded))
    assert any(kw["mask"] is not None for kw in seen)


def test_static_cache_with_left_padding_runs_the_mask_route(one_thread):
    """generate(cache_implementation="static") on a left-padded batch: the decode masks keep
    keys [pad_b, position] of a fixed-size cache, which no single description states, so
    they reach the kernels as mask tensors; still 0 fallbacks and sdpa's tokens."""
    model = models.build_model("llama")
    ids, mask = models.prompts("padded", "cpu")
    options = dict(attention_mask=mask, max_new_tokens=12, do_sample=False, pad_token_id=0,
                   eos_token_id=None, cache_implementation="static")
    with torch.no_grad():
        ref = model.generate(ids, **options)
        hf_attention.use_course_attention(model)
        hf_attention.reset_counters()
        ours = model.generate(ids, **options)
    assert hf_attention.fallback_total() == 0, hf_attention.fallback_counts()
    assert hf_attention.call_counts().get("mask", 0) > 0, hf_attention.call_counts()
    assert torch.equal(ours, ref)


def test_command_prints_and_records(one_thread, tmp_path, monkeypatch, capsys):
    import common.results as results

    monkeypatch.setattr(results, "RESULTS_DIR", tmp_path)
    code = models.main(["--model", "gpt2", "--single", "--new-tokens", "4", "--device", "cpu",
                        "--record"])
    out = capsys.readouterr().out
    assert code == 0, out
    assert "gpt2     single  | fallbacks 0" in out and "fp32 tokens identical" in out
    # The figures go to results/<this machine's GPU, or cpu>.json, even for a --device cpu run.
    recorded = results.load(results.results_path())["metrics"]
    assert recorded["task7.hf.gpt2.single.fallbacks"] == 0
    assert recorded["task7.hf.gpt2.single.tokens_equal"] == 1
    assert models.main(["--new-tokens", "0"]) == 2


def test_model_metrics_have_the_issue_names():
    """The issue's names, declared in task7/manifest.py, each shown in its Results.md table."""
    from task7 import manifest

    r = models.CaseResult("llama", "padded", tokens_equal=True)
    metrics = r.metrics()
    assert metrics["task7.hf.llama.padded.fallbacks"] == 0
    assert metrics["task7.hf.llama.padded.tokens_equal"] == 1.0
    assert set(metrics) == {manifest.hf("llama", "padded", f) for f in manifest.HF_FIELDS}
    shown = {cell.name for row in manifest.HF_SECTION.blocks[0].rows for cell in row.cells
             if not isinstance(cell, str)}
    assert {m for m in metrics if not m.endswith("fp16_logits_err")} <= shown


def test_qwen2_hybrid_sliding_layers_and_a_decode_chunk(one_thread):
    """Qwen2 with a sliding layer beside a full one (two masks per forward, both cached), the
    prompt in three chunks: prefill, a multi-token chunk across the window, a single token."""
    transformers = pytest.importorskip("transformers")
    from transformers import AutoModelForCausalLM

    config = models.model_config("qwen2").to_dict()
    config.update(use_sliding_window=True, max_window_layers=1, sliding_window=12,
                  layer_types=None)
    config = transformers.Qwen2Config(**config)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config, attn_implementation="sdpa").eval()
    if "sliding_attention" not in (getattr(model.config, "layer_types", None) or []):
        pytest.skip("this transformers version has no per-layer sliding attention for Qwen2")
    ids, mask = models.prompts("padded", "cpu")
    with torch.no_grad():
        full = model(input_ids=ids, attention_mask=mask).logits.float()
        hf_attention.use_course_attention(model)
        hf_attention.reset_counters()
        cache, pieces = None, []
        for lo, hi in ((0, 30), (30, 47), (47, 48)):
            out = model(input_ids=ids[:, lo:hi], attention_mask=mask[:, :hi],
                        past_key_values=cache, use_cache=True)
            cache = out.past_key_values          # the model's own cache (sliding layers too)
            pieces.append(out.logits.float())
    assert hf_attention.fallback_total() == 0, hf_attention.fallback_counts()
    chunked = torch.cat(pieces, dim=1)
    real = mask.bool()
    diff = (chunked - full).abs().amax(-1)[real].max().item()
    assert diff <= models.LOGIT_RTOL * max(1.0, full.abs().max().item()), diff


# --- plans for the masks transformers builds ---------------------------------------------------

def test_left_padded_prefill_is_structured():
    padding = _left_padding([20, 15, 9], 20)
    mask = _sdpa_mask(3, 20, 20, 0, padding)
    q, k, v = _qkv(3, 8, 2, 20, 20)                   # GQA 4:1, KV heads as they are
    plan = plan_attention(q, k, mask, True)
    assert plan.kind == "structured" and plan.causal and plan.left_padding and not plan.window
    assert plan.key_lengths.dtype == torch.int32 and plan.key_lengths.tolist() == [20, 15, 9]
    out = _attend(q, k, v, mask)
    ref = reference_attention_variant(q, k, v, Variant(mask=mask))
    assert (out.double() - ref).abs().max() < 1e-5


@pytest.mark.parametrize("q_len,q_offset", [(20, 0), (6, 14), (1, 19)])
def test_sliding_window_with_left_padding(q_len, q_offset):
    """Mistral's mask (kv_idx > q_idx - window on top of causal and padding): structured, with
    the window only where it hides something, for prefill, a chunk after a cache and decode."""
    padding = _left_padding([20, 15, 9], 20)
    mask = _sdpa_mask(3, q_len, 20, q_offset, padding, window=7)
    q, k, v = _qkv(3, 8, 2, q_len, 20)
    plan = plan_attention(q, k, mask, True, sliding_window=7)
    assert plan.kind == "structured" and plan.causal, plan.describe()
    if q_len > 1:
        assert plan.window == 7
    out = _attend(q, k, v, mask, sliding_window=7)
    ref = reference_attention_variant(q, k, v, Variant(mask=mask))
    assert (out.double() - ref).abs().max() < 1e-5


def test_continuation_after_a_cache_is_bottom_right_causal():
    """Sq < Sk without padding: transformers' mask is the bottom-right triangle."""
    mask = _sdpa_mask(2, 5, 12, 7, None)
    q, k, v = _qkv(2, 4, 4, 5, 12)
    plan = plan_attention(q, k, mask, True)
    assert plan.kind == "structured" and plan.causal and plan.key_lengths is None
    ref = reference_attention_variant(q, k, v, Variant(causal=True))
    assert (_attend(q, k, v, mask).double() - ref).abs().max() < 1e-5


def test_static_cache_prefix_is_structured_and_with_padding_is_a_mask():
    filled = torch.zeros(2, 28, dtype=torch.bool)
    filled[:, :21] = True                            # a static cache of 28, 21 filled
    decode = _sdpa_mask(2, 1, 28, 20, filled)
    q, k, v = _qkv(2, 4, 2, 1, 28)
    plan = plan_attention(q, k, decode, True)
    assert plan.kind == "structured" and not plan.left_padding
    assert plan.key_lengths.tolist() == [21, 21]
    # left padding inside a static cache: keys [begin, 21) is no single description
    padded = filled.clone()
    padded[1, :6] = False
    prefill = _sdpa_mask(2, 21, 28, 0, padded)
    q, k, v = _qkv(2, 4, 2, 21, 28)
    plan = plan_attention(q, k, prefill, True)
    assert plan.kind == "mask" and plan.mask.dtype == torch.bool and plan.causal
    ref = reference_attention_variant(q, k, v, Variant(mask=prefill))
    assert (_attend(q, k, v, prefill).double() - ref).abs().max() < 1e-5


def test_old_float_masks_and_real_biases():
    """transformers 4.48-4.52 pass 0 / dtype-minimum float masks: the same structured plans.
    A real bias goes to the kernels as the additive float mask itself, not to SDPA."""
    padding = _left_padding([12, 7], 12)
    keep = _sdpa_mask(2, 12, 12, 0, padding)
    additive = torch.where(keep, 0.0, torch.finfo(torch.float32).min)
    q, k, v = _qkv(2, 4, 2, 12, 12)
    plan = plan_attention(q, k, additive, True)
    assert plan.kind == "structured" and plan.key_lengths.tolist() == [12, 7]
    bias = torch.randn(1, 1, 12, 12, generator=torch.Generator().manual_seed(1))
    plan = plan_attention(q, k, bias, True)
    assert plan.kind == "mask" and plan.mask.is_floating_point()
    ref = reference_attention_variant(q, k, v, Variant(mask=bias))
    assert (_attend(q, k, v, bias).double() - ref).abs().max() < 1e-5


def test_random_and_per_head_masks_run_as_mask_tensors():
    gen = torch.Generator().manual_seed(2)
    q, k, v = _qkv(2, 4, 1, 9, 13)                   # MQA
    mask = torch.rand(2, 4, 9, 13, generator=gen) > 0.4
    mask[0, 1, 3] = False                            # a row that sees nothing: zeros
    plan = plan_attention(q, k, mask, True)
    assert plan.kind == "mask"
    out = _attend(q, k, v, mask)
    ref = reference_attention_variant(q, k, v, Variant(mask=mask))
    assert (out.double() - ref).abs().max() < 1e-5
    assert out[0, 1, 3].abs().max() == 0


def test_decode_masks_that_are_not_one_key_range():
    q, k, v = _qkv(2, 4, 2, 1, 10)
    holes = torch.ones(2, 1, 1, 10, dtype=torch.bool)
    holes[1, ..., 4] = False                         # a hole: no single key range
    per_head = torch.ones(2, 4, 1, 10, dtype=torch.bool)
    per_head[0, 2, :, :3] = False                    # one head padded differently
    for mask in (holes, per_head):
        plan = plan_attention(q, k, mask, True)
        assert plan.kind == "mask", plan.describe()
        ref = reference_attention_variant(q, k, v, Variant(mask=mask))
        assert (_attend(q, k, v, mask).double() - ref).abs().max() < 1e-5


def test_no_mask_plans_follow_sdpa():
    q, k, _ = _qkv(1, 4, 2, 7, 7)
    assert plan_attention(q, k, None, True).causal
    assert not plan_attention(q, k, None, False).causal
    q1, k12, _ = _qkv(1, 4, 2, 1, 12)
    plan = plan_attention(q1, k12, None, True, sliding_window=4)
    assert plan.kind == "structured" and plan.window == 4
    q7, _, _ = _qkv(1, 4, 2, 7, 12)                  # an empty static cache: tail cut off
    assert plan_attention(q7, k12, None, True).key_len == 7


def test_one_verdict_per_mask_object(monkeypatch):
    padding = _left_padding([10, 6], 10)
    mask = _sdpa_mask(2, 10, 10, 0, padding)
    q, k, v = _qkv(2, 4, 2, 10, 10)
    calls = []
    real = hf_attention.plan_from_mask
    monkeypatch.setattr(hf_attention, "plan_from_mask",
                        lambda *a, **kw: calls.append(1) or real(*a, **kw))
    for _ in range(3):                               # three layers, one mask
        _attend(q, k, v, mask)
    assert len(calls) == 1
    _attend(q, k, v, mask.clone())                   # a new mask: a new verdict
    assert len(calls) == 2


# --- fallbacks, counted --------------------------------------------------------------------

def test_fallbacks_are_counted_with_their_reason():
    hf_attention.reset_counters()
    q, k, v = _qkv(1, 4, 2, 6, 6)
    _attend(q, k, v, None)
    assert hf_attention.fallback_total() == 0 and hf_attention.call_counts() == {"structured": 1}

    # softcap (Gemma 2): on the kernels now, transformers' eager formula
    out = _attend(q, k, v, None, softcap=2.0)
    kk, vv = k.repeat_interleave(2, 1), v.repeat_interleave(2, 1)
    scores = torch.tanh((q @ kk.transpose(-1, -2)) / 32 ** 0.5 / 2.0) * 2.0
    scores = scores.masked_fill(~torch.ones(6, 6, dtype=torch.bool).tril(), float("-inf"))
    assert torch.allclose(out, torch.softmax(scores, -1) @ vv, atol=1e-5)
    assert hf_attention.fallback_total() == 0

    _attend(q, k, v, None, dropout=0.5, training=True)      # dropout while training
    _attend(q, k, v, None, dropout=0.5, training=False)     # eval: no dropout, kernels
    q9, k9, v9 = _qkv(1, 2, 2, 3, 3, head_dim=12)           # head_dim not a multiple of 8
    _attend(q9, k9, v9, None)
    q264, k264, v264 = _qkv(1, 2, 2, 3, 3, head_dim=264)    # past the kernels' 256
    _attend(q264, k264, v264, None)
    _attend(q, k, v, None, s_aux=torch.zeros(4))            # sinks: kernels
    with torch.enable_grad():                               # sinks that need a gradient
        _attend(q, k, v, None, s_aux=torch.zeros(4, requires_grad=True))
    counts = hf_attention.fallback_counts()
    assert counts.pop("dropout in training") == 1
    assert counts.pop("attention sinks (s_aux) that require grad") == 1
    assert sorted(counts) == ["head_dim 12 (kernels: a multiple of 8 up to 256)",
                              "head_dim 264 (kernels: a multiple of 8 up to 256)"]
    assert hf_attention.fallback_total() == 4
    assert hf_attention.call_counts()["structured"] == 4
    hf_attention.reset_counters()
    assert hf_attention.fallback_total() == 0 and hf_attention.call_counts() == {}


def test_sinks_are_gpt_oss_eager():
    hf_attention.reset_counters()
    q, k, v = _qkv(1, 4, 2, 5, 5)
    sinks = torch.randn(4, generator=torch.Generator().manual_seed(3))
    out = _attend(q, k, v, None, s_aux=sinks)
    assert hf_attention.fallback_total() == 0
    kk, vv = k.repeat_interleave(2, 1), v.repeat_interleave(2, 1)
    scores = (q @ kk.transpose(-1, -2)) / 32 ** 0.5
    scores = scores.masked_fill(~torch.ones(5, 5, dtype=torch.bool).tril(), float("-inf"))
    combined = torch.cat([scores, sinks.view(1, 4, 1, 1).expand(1, 4, 5, 1)], -1)
    probs = torch.softmax(combined, -1)[..., :-1]
    assert torch.allclose(out, probs @ vv, atol=1e-5)


def test_bad_head_ratio_is_refused():
    q, k, v = _qkv(1, 4, 3, 2, 2)
    with pytest.raises(ValueError, match="multiple"):
        _attend(q, k, v, None)


# --- GPU: the kernels ------------------------------------------------------------------------

@pytest.mark.gpu
@pytest.mark.slow
@needs_cuda
@pytest.mark.parametrize("case", models.CASES)
@pytest.mark.parametrize("model", models.MODELS)
def test_model_on_the_kernels_gpu(model, case):
    """The acceptance run: 0 fallbacks, identical fp32 greedy tokens over 40 new tokens, the
    continuation after a cache, fp16 first-step logits within tolerance."""
    r = models.run_case(model, case, device="cuda", new_tokens=models.NEW_TOKENS, timing=False)
    assert r.fallbacks == 0 and r.chunked_fallbacks == 0, r.fallback_reasons
    assert r.tokens_equal, r.first_difference
    assert r.chunked_ok, f"chunked logits differ by {r.chunked_diff:.2e}"
    assert r.fp16_ok, f"fp16 logits error {r.fp16_err:.2e} > {r.fp16_tol:.2e}"


@pytest.mark.gpu
@needs_cuda
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_plans_on_the_kernels_gpu(dtype):
    """Every plan kind on the kernels against the float64 truth (FlashAttention-2's criterion)."""
    from common.variants import fa2_criterion, pytorch_attention_variant

    padding = _left_padding([40, 33, 17], 40).cuda()
    cases = [
        ("left-padded prefill", 40, _sdpa_mask(3, 40, 40, 0, padding, device="cuda")),
        ("window 7, chunk after a cache", 9, _sdpa_mask(3, 9, 40, 31, padding, window=7,
                                                        device="cuda")),
        ("left-padded decode", 1, _sdpa_mask(3, 1, 40, 39, padding, device="cuda")),
        ("random mask", 40, torch.rand(3, 1, 40, 40, device="cuda") > 0.3),
    ]
    for name, q_len, mask in cases:
        q, k, v = (t.cuda() for t in _qkv(3, 8, 2, q_len, 40, head_dim=64, dtype=dtype))
        out = _attend(q, k, v, mask)
        variant = Variant(mask=mask)
        ok, err, bound = fa2_criterion(out, reference_attention_variant(q, k, v, variant),
                                       pytorch_attention_variant(q, k, v, variant))
        assert ok, f"{name}: error {err:.2e} > {bound:.2e}"
