"""Task 6: the dummy LLM. GPU tests wrap task6.test's groups; the rest runs on a CPU with the
PyTorch attention path (and, for the custom branch's wiring, plain-torch stand-ins that
keep the kernels' documented contracts)."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F

import task6.model as model_module
from common.checks import assert_checks, poison_, relative_error
from task6 import test as task6_test
from task6.generate import generate
from task6.model import customModel
from task5.ops import torch_ops
from task6.rope import RotaryEmbedding, apply_rope, rope_tables, rotate_half

TINY = task6_test.TINY[1]   # hidden 128, 2 heads (head_dim 64), 2 layers, vocab 97


def tiny_model(dtype=torch.float32, seed=0, attention="torch") -> customModel:
    return customModel(TINY.hidden, TINY.heads, TINY.layers, TINY.vocab, max_seq_len=64,
                       attention=attention, dtype=dtype, seed=seed)


def tokens(batch=2, seq=9, seed=0) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(0, TINY.vocab, (batch, seq), generator=gen)


# --- GPU: the groups of python -m task6.test ---------------------------------------------------

@pytest.mark.gpu
def test_task6_inputs():
    checks, _ = task6_test.inputs_group()
    assert_checks(checks)


@pytest.mark.gpu
def test_task6_small():
    checks, _ = task6_test.small_group()
    assert_checks(checks)


@pytest.mark.gpu
@pytest.mark.slow
def test_task6_correctness():
    checks, _ = task6_test.correctness_group()
    assert_checks(checks)


@pytest.mark.timed
@pytest.mark.gpu
@pytest.mark.slow
def test_task6_course():
    checks, _ = task6_test.course_group()
    assert_checks(checks)


@pytest.mark.timed
@pytest.mark.gpu
@pytest.mark.slow
def test_task6_gqa_course():
    """Issue 32's GQA configuration (not in the main job: run here and by run_all --everything)."""
    checks, metrics = task6_test.gqa_course_group()
    assert_checks(checks)
    assert "task6.gqa.bf16.tbt_over_bytes_roofline" in metrics


def test_the_kv_bytes_roofline_counts_the_kv_heads():
    """A decode step of the GQA model reads K and V of 8 heads, not 32: a quarter of the course
    model's cache bytes (the roofline task6.gqa.bf16.tbt_over_bytes_roofline divides by)."""
    gqa, mha = task6_test.GQA_COURSE, task6_test.COURSE
    assert gqa.kv_heads == 8 and gqa.heads == 32 and gqa.hidden == mha.hidden
    assert task6_test.decode_kv_bytes(gqa, 2) * 4 == task6_test.decode_kv_bytes(mha, 2)
    assert task6_test.decode_kv_bytes(mha, 2) == (
        2.0 * mha.layers * mha.batch * (mha.prompt + mha.new_tokens / 2) * mha.hidden * 2)


# --- RoPE ---------------------------------------------------------------------------------------

def test_rope_matches_the_textbook_rotate_half_form():
    cos, sin = rope_tables(16, 32)
    x = torch.randn(2, 5, 3, 16)
    positions = slice(7, 12)
    expected = x * cos[positions][None, :, None] + rotate_half(x) * sin[positions][None, :, None]
    torch.testing.assert_close(apply_rope(x, cos[positions], sin[positions]), expected)


def test_rope_takes_a_strided_view_and_returns_a_contiguous_tensor():
    qkv = torch.randn(2, 5, 3 * 4 * 8).view(2, 5, 3, 4, 8)
    rope = RotaryEmbedding(8, 16)
    cos, sin = rope.at(3, 5, torch.float32)
    k = qkv.unbind(2)[1]
    out = apply_rope(k, cos, sin)
    assert out.is_contiguous() and not k.is_contiguous()
    torch.testing.assert_close(out, apply_rope(k.contiguous(), cos, sin))


def test_rope_scores_depend_only_on_relative_position():
    rope = RotaryEmbedding(32, 4096)
    q = torch.randn(1, 1, 4, 32, dtype=torch.float64)
    k = torch.randn(1, 1, 4, 32, dtype=torch.float64)

    def score(m, n):
        qm = apply_rope(q, *rope.at(m, 1, torch.float64))
        kn = apply_rope(k, *rope.at(n, 1, torch.float64))
        return (qm * kn).sum(-1)

    base = score(5, 2)
    for shift in (1, 100, 3000):
        torch.testing.assert_close(score(5 + shift, 2 + shift), base, rtol=1e-5, atol=1e-5)
    assert not torch.allclose(score(6, 2), base)   # but they do depend on it


def test_rope_is_the_identity_at_position_zero_and_keeps_norms():
    rope = RotaryEmbedding(16, 64)
    x = torch.randn(2, 3, 2, 16)
    torch.testing.assert_close(apply_rope(x[:, :1], *rope.at(0, 1, torch.float32)), x[:, :1])
    rotated = apply_rope(x, *rope.at(40, 3, torch.float32))
    torch.testing.assert_close(rotated.norm(dim=-1), x.norm(dim=-1))


def test_rope_tables_at_a_position_tensor_equal_the_slice():
    rope = RotaryEmbedding(16, 64)
    for got, want in zip(rope.at(torch.tensor(17, dtype=torch.int32), 1, torch.float32),
                         rope.at(17, 1, torch.float32), strict=True):
        assert torch.equal(got, want)


def test_rope_needs_an_even_head_dim():
    with pytest.raises(ValueError, match="even"):
        rope_tables(15, 8)


# --- the model on the PyTorch path --------------------------------------------------------------

def test_model_shapes_and_cache_layout():
    model = tiny_model()
    logits, cache = model(tokens(3, 9))
    assert logits.shape == (3, 9, TINY.vocab) and logits.dtype == torch.float32
    assert len(cache) == TINY.layers
    assert all(t.shape == (3, model.max_seq_len, TINY.hidden) for pair in cache for t in pair)
    last, _ = model(tokens(3, 9), model.allocate_kv_cache(3, 9), last_logits_only=True)
    torch.testing.assert_close(last, logits[:, -1:])


def test_weights_are_seeded_and_built_in_the_target_dtype():
    a, b, c = tiny_model(seed=1), tiny_model(seed=1), tiny_model(seed=2)
    assert all(torch.equal(x, y) for x, y in zip(a.state_dict().values(), b.state_dict().values(), strict=True))
    assert not torch.equal(a.lm_head.weight, c.lm_head.weight)
    half = tiny_model(dtype=torch.bfloat16)
    assert all(p.dtype == torch.bfloat16 for p in half.parameters())
    assert half.rope.cos.dtype == torch.float32   # tables stay float32
    # GPT-2 init: residual projections scaled down; LayerNorms start as the identity.
    assert a.layers[0].attn.o_proj.weight.std() < a.layers[0].attn.qkv_proj.weight.std()
    assert torch.equal(a.layers[0].ln1.weight, torch.ones(TINY.hidden))


def test_course_model_size_without_allocating_it():
    model = customModel(4096, 32, 24, 8192, device="meta")
    params = sum(p.numel() for p in model.parameters())
    assert params == 24 * (4 * 4096**2 + 3 * 4096 + 4096 + 3 * 4096 * 16384 + 4 * 4096) + 2 * 8192 * 4096 + 2 * 4096
    # What a decode step reads: every weight but the embedding table, ~25.9 GB in fp32.
    assert task6_test.decode_weight_bytes(model) == 4 * (params - 8192 * 4096)
    flops = task6_test.prefill_flops(model, 4, 1024)
    assert 2 * 6.4e9 * 4 * 1024 < flops < 2 * 6.6e9 * 4 * 1024 + 24 * 4 * 4 * 32 * 1024**2 * 128


def test_prefill_equals_decoding_token_by_token():
    model = tiny_model()
    seq = tokens(2, 11)
    full, _ = model(seq)
    for position in ("int", "tensor"):
        cache = model.allocate_kv_cache(2, 11)
        steps = []
        for i in range(11):
            pos = i if position == "int" else torch.tensor(i, dtype=torch.int32)
            logits, returned = model(seq[:, i:i + 1], cache, pos)
            assert returned is cache
            steps.append(logits)
        err = relative_error(torch.cat(steps, dim=1), full.double())
        assert err < 1e-5, f"{position} positions: rel_err {err:.2e}"


def test_cache_is_written_once_per_position_and_never_reallocated():
    model = tiny_model()
    seq = tokens(2, 8)
    cache = model.allocate_kv_cache(2, 12)
    for k_cache, v_cache in cache:
        poison_(k_cache)
        poison_(v_cache)
    pointers = [t.data_ptr() for pair in cache for t in pair]

    def written():   # positions holding finite values, checked in every layer's K and V
        counts = {int(torch.isfinite(t).all(dim=(0, 2)).sum()) for pair in cache for t in pair}
        assert len(counts) == 1, f"layers disagree on how much is written: {counts}"
        return counts.pop()

    model(seq[:, :5], cache)
    assert written() == 5
    for i in range(5, 8):
        model(seq[:, i:i + 1], cache, i)
        assert written() == i + 1
    assert [t.data_ptr() for pair in cache for t in pair] == pointers


def test_cache_holds_rotated_keys():
    model = tiny_model()
    seq = tokens(2, 6)
    _, cache = model(seq, model.allocate_kv_cache(2, 6))
    layer = model.layers[0]
    qkv = layer.attn.qkv_proj(layer.ln1(model.embed(seq)))   # [B, S, 3 * hidden]: q | k | v
    k, v = qkv[..., TINY.hidden:2 * TINY.hidden], qkv[..., 2 * TINY.hidden:]
    k = apply_rope(k.reshape(2, 6, TINY.heads, -1), *model.rope.at(0, 6, torch.float32))
    torch.testing.assert_close(cache[0][0], k.reshape(2, 6, TINY.hidden))
    torch.testing.assert_close(cache[0][1], v)


def test_generate_is_greedy_and_allocates_the_cache_once(monkeypatch):
    model = tiny_model()
    calls = []
    allocate = model.allocate_kv_cache
    monkeypatch.setattr(model, "allocate_kv_cache", lambda *a: calls.append(a) or allocate(*a))
    prompt = tokens(2, 7)
    new, logits = generate(model, prompt, 6, return_logits=True)
    assert calls == [(2, 13)], "one cache per generation, sized prompt + max_new_tokens"
    assert new.shape == (2, 6) and torch.equal(new, logits.argmax(-1))
    expected = task6_test.teacher_forced_logits(model, prompt, new)
    assert relative_error(logits, expected.double()) < 1e-5


def test_generate_on_a_cpu_ignores_the_graph_flag_and_fills_no_timings():
    model = tiny_model()
    timings = {}
    a = generate(model, tokens(1, 4), 3, use_cuda_graph=True, timings=timings)
    b = generate(model, tokens(1, 4), 3, use_cuda_graph=False)
    assert torch.equal(a, b) and timings == {}


def test_sampling_uses_the_generator():
    model = tiny_model()
    draw = [generate(model, tokens(2, 4), 5, greedy=False, temperature=5.0,
                     generator=torch.Generator().manual_seed(3)) for _ in range(2)]
    assert torch.equal(draw[0], draw[1])


def test_bad_input_raises_a_clear_error_on_the_torch_path():
    assert_checks(task6_test.input_checks(torch.device("cpu"), "torch"))


def test_backend_switch_keeps_the_weights():
    model = tiny_model()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    model.attention_backend = "custom"
    model.attention_backend = "torch"
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    with pytest.raises(ValueError, match="attention"):
        model.attention_backend = "sdpa"


# --- the custom branch's wiring, on stand-ins for the kernels --------------------------------------

class FakeKernels:
    """Plain-torch stand-ins with the documented contracts of task 4's flash_attention and
    task 5's cache and decode entry points; they assert what the real kernels require."""

    def __init__(self):
        self.calls: list[str] = []

    def flash_attention(self, q, k, v, causal=False, out=None):
        assert q.dim() == 4 and k.shape == v.shape and causal
        assert q.shape[0] == k.shape[0] and q.shape[2:] == k.shape[2:] and q.shape[1] % k.shape[1] == 0
        assert all(t.stride(-1) == 1 for t in (q, k, v)), "the last dim must be contiguous"
        self.calls.append("flash_attention")
        return torch_ops().flash_attention(q, k, v, causal=True)

    def allocate_kv_cache(self, batch, max_seq_len, hidden, dtype, device):
        # NaN-filled: a read of a position that was never written shows up in the logits.
        return tuple(torch.full((batch, max_seq_len, hidden), math.nan, dtype=dtype, device=device)
                     for _ in range(2))

    @staticmethod
    def _position(value) -> int:
        if isinstance(value, torch.Tensor):
            assert value.dtype == torch.int32 and value.dim() == 0, (value.dtype, value.shape)
            return int(value)
        assert isinstance(value, int)
        return value

    def update_kv_cache(self, k_cache, v_cache, k, v, current_pos):
        pos = self._position(current_pos)
        assert k.stride(-1) == 1 and v.stride(-1) == 1 and k.dim() == 3 and k.shape == v.shape
        assert k.shape[0] == k_cache.shape[0] and k.shape[2] == k_cache.shape[2]
        assert 0 <= pos and pos + k.shape[1] <= k_cache.shape[1]
        self.calls.append("update_kv_cache")
        k_cache[:, pos:pos + k.shape[1]] = k
        v_cache[:, pos:pos + v.shape[1]] = v

    def decode_attention(self, q, k_cache, v_cache, num_heads, seq_len, causal=False, out=None,
                         num_splits=None, fresh_keys=None):
        batch, one, hidden = q.shape
        assert one == 1 and q.stride(-1) == 1
        # Only after rope_append, which wrote the one new position, may the model promise it.
        assert fresh_keys is None or (fresh_keys == 1 and self.calls[-1] == "rope_append")
        n = self._position(seq_len)
        self.calls.append("decode_attention")
        # Only the first n cached positions exist (the rest is NaN).
        return torch_ops().decode_attention(q, k_cache[:, :n], v_cache[:, :n], num_heads, n)

    # The fused kernels of a decode step (task5/fused.py), on their PyTorch twins.
    def add_norm(self, x, weight, bias=None, eps=1e-5, residual=None, rms=False):
        assert x.is_contiguous() and residual is None
        self.calls.append("add_norm")
        return torch_ops().add_norm(x, weight, bias, eps, residual, rms)

    def rope_append(self, q, k, v, k_cache, v_cache, cos, sin, current_pos):
        pos = self._position(current_pos)
        assert q.dim() == k.dim() == v.dim() == 4 and k.shape == v.shape and q.shape[1] == k.shape[1]
        assert cos.dtype == sin.dtype == torch.float32 and cos.shape[1] == q.shape[-1]
        assert 0 <= pos and pos + q.shape[1] <= min(k_cache.shape[1], cos.shape[0])
        self.calls.append("rope_append")
        return torch_ops().rope_append(q, k, v, k_cache, v_cache, cos, sin, current_pos).contiguous()

    def decode_swiglu(self, x, weight, bias=None, residual=None):
        assert x.numel() // x.shape[-1] <= 8 and weight.shape[0] % 2 == 0
        self.calls.append("decode_swiglu")
        return torch_ops().decode_swiglu(x, weight, bias, residual)

    def decode_linear(self, x, weight, bias=None, residual=None):
        # Only in decode steps (a few rows); not logged, so `calls` lists the attention only.
        assert x.numel() // x.shape[-1] <= 8 and x.shape[-1] == weight.shape[1]
        out = F.linear(x, weight, bias)
        return out if residual is None else out + residual


@pytest.fixture
def fake_kernels(monkeypatch):
    fake = FakeKernels()
    monkeypatch.setattr(model_module, "kernels", lambda: fake)
    monkeypatch.setattr(customModel, "_check_kernel_device", lambda self: None)
    return fake


def _custom_generation_matches_torch(model: customModel) -> None:
    """5 greedy tokens on the torch path, then on the custom branch (the fakes): the same tokens,
    logits within 1e-5. Leaves the model on the custom branch."""
    prompt = tokens(2, 9)
    ref_tokens, ref_logits = generate(model, prompt, 5, return_logits=True)
    model.attention_backend = "custom"
    new, logits = generate(model, prompt, 5, return_logits=True)
    assert torch.equal(new, ref_tokens)
    assert relative_error(logits, ref_logits.double()) < 1e-5


def test_custom_branch_calls_the_kernels_as_documented(fake_kernels):
    """The course's path (fused_decode and fused_prefill False): the student's attend_custom in
    both phases."""
    model = tiny_model()
    model.fused_decode = model.fused_prefill = False
    _custom_generation_matches_torch(model)
    per_layer = TINY.layers
    assert fake_kernels.calls[:2 * per_layer] == ["update_kv_cache", "flash_attention"] * per_layer
    assert fake_kernels.calls[2 * per_layer:] == ["update_kv_cache", "decode_attention"] * per_layer * 4


def test_fused_decode_calls_the_fused_kernels(fake_kernels):
    """The default decode on our kernels: per layer one norm, RoPE + cache append, the
    decode, one norm, SwiGLU (plus the final norm); the default prefill: RoPE + cache append,
    then the attention over the cache (fused_prefill=False: the course's prefill)."""
    model = tiny_model()
    _custom_generation_matches_torch(model)
    per_layer = TINY.layers
    assert fake_kernels.calls[:2 * per_layer] == ["rope_append", "flash_attention"] * per_layer
    step = ["add_norm", "rope_append", "decode_attention", "add_norm", "decode_swiglu"] * per_layer
    assert fake_kernels.calls[2 * per_layer:] == (step + ["add_norm"]) * 4


@pytest.mark.parametrize("fused", [True, False])
def test_custom_branch_decodes_with_a_position_tensor(fake_kernels, fused):
    model = tiny_model(attention="custom")
    model.fused_decode = fused
    seq = tokens(2, 7)
    full, _ = model(seq)
    cache = model.allocate_kv_cache(2, 7)
    model(seq[:, :4], cache)
    steps = [model(seq[:, i:i + 1], cache, torch.tensor(i, dtype=torch.int32))[0] for i in range(4, 7)]
    assert relative_error(torch.cat(steps, dim=1), full[:, 4:].double()) < 1e-5


# --- the Llama-style configuration: RMSNorm, no biases, grouped-query attention -------------------

def llama_model(attention="torch", dtype=torch.float32) -> customModel:
    return customModel(128, 4, 2, 97, max_seq_len=64, attention=attention, dtype=dtype,
                       style="llama", num_kv_heads=2)


def test_llama_style_has_rmsnorm_no_biases_and_a_grouped_cache():
    model = llama_model()
    assert isinstance(model.layers[0].ln1, torch.nn.RMSNorm) and isinstance(model.ln_f, torch.nn.RMSNorm)
    assert not [n for n, _ in model.named_parameters() if n.endswith("bias")]
    assert model.layers[0].attn.qkv_proj.weight.shape == ((4 + 2 * 2) * 32, 128)
    k_cache, v_cache = model.allocate_kv_cache(2, 10)[0]
    assert k_cache.shape == v_cache.shape == (2, 10, 2 * 32)
    with pytest.raises(ValueError, match="num_kv_heads 3 must divide num_heads 4"):
        customModel(128, 4, 1, 97, num_kv_heads=3)
    with pytest.raises(ValueError, match="style"):
        customModel(128, 4, 1, 97, style="mistral")


def test_llama_style_attention_is_grouped_query_attention():
    """The torch path's GQA equals attention with each KV head repeated for its query group,
    and a prefill equals decoding token by token through the grouped cache."""
    model = llama_model()
    seq = tokens(2, 8)
    full, _ = model(seq)
    cache = model.allocate_kv_cache(2, 8)
    model(seq[:, :5], cache)
    steps = [model(seq[:, i:i + 1], cache, i)[0] for i in range(5, 8)]
    assert relative_error(torch.cat(steps, dim=1), full[:, 5:].double()) < 1e-5
    q, k, v = torch.randn(2, 4, 6, 32), torch.randn(2, 2, 6, 32), torch.randn(2, 2, 6, 32)
    repeated = F.scaled_dot_product_attention(q, k.repeat_interleave(2, 1), v.repeat_interleave(2, 1),
                                              is_causal=True)
    assert torch.allclose(torch_ops().flash_attention(q, k, v, causal=True), repeated)


@pytest.mark.parametrize("fused", [True, False])
def test_llama_style_runs_through_the_custom_branch(fake_kernels, fused):
    model = llama_model()
    model.fused_decode = model.fused_prefill = fused
    _custom_generation_matches_torch(model)
    assert ("rope_append" in fake_kernels.calls) == fused


# --- the fused kernels' PyTorch twins (task5/ops.py): what the kernels are tested against ---------

def test_rope_append_twin_is_task6_rope_and_the_cache_write():
    rope = RotaryEmbedding(32, 20)
    q, k, v = torch.randn(2, 3, 4, 32), torch.randn(2, 3, 2, 32), torch.randn(2, 3, 2, 32)
    caches = [torch.zeros(2, 20, 64) for _ in range(2)]
    for pos in (5, torch.tensor(5, dtype=torch.int32)):
        for c in caches:
            c.zero_()
        q_rot = torch_ops().rope_append(q, k, v, *caches, rope.cos, rope.sin, pos)
        cos, sin = rope.at(5, 3, torch.float32)
        assert torch.equal(q_rot, apply_rope(q, cos, sin))
        assert torch.equal(caches[0][:, 5:8], apply_rope(k, cos, sin).flatten(2))
        assert torch.equal(caches[1][:, 5:8], v.flatten(2))
        assert not caches[0][:, :5].any() and not caches[0][:, 8:].any()


def test_norm_and_swiglu_twins():
    x, r, w, b = torch.randn(3, 64), torch.randn(3, 64), torch.randn(64), torch.randn(64)
    out, h = torch_ops().add_norm(x, w, b, 1e-5, residual=r)
    assert torch.equal(h, x + r) and torch.allclose(out, F.layer_norm(x + r, (64,), w, b, 1e-5))
    rms = torch_ops().add_norm(x, w, None, 1e-6, rms=True)
    expected = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * w
    assert torch.allclose(rms, expected, atol=1e-6)
    weight = torch.randn(2 * 16, 64)
    gate, up = x @ weight[:16].T, x @ weight[16:].T
    assert torch.allclose(torch_ops().decode_swiglu(x, weight), F.silu(gate) * up, atol=1e-6)


# --- task6.test's pieces that need no GPU ---------------------------------------------------------

def test_groups_fail_cleanly_without_a_gpu():
    if torch.cuda.is_available():
        pytest.skip("checks the message given without a GPU")
    for group in task6_test.GROUPS.values():
        checks, metrics = group(None)
        assert len(checks) == 1 and not checks[0].passed and "GPU" in checks[0].detail and not metrics


def test_cli_options_reach_the_groups():
    import argparse

    parser = argparse.ArgumentParser()
    task6_test.extra_args(parser)
    args = parser.parse_args(["--dtype", "bf16,fp16", "--hidden", "1024", "--new-tokens", "8"])
    assert task6_test._dtypes(args) == ["bf16", "fp16"]
    cfg = task6_test._course_config(args)
    assert (cfg.hidden, cfg.heads, cfg.new_tokens) == (1024, 32, 8)
    assert task6_test._dtypes(None) == ["fp32", "bf16"] and task6_test._course_config(None) == task6_test.COURSE
    with pytest.raises(ValueError):
        task6_test._dtypes(SimpleNamespace(dtype="fp8"))


def test_decode_kv_bytes_is_the_mean_over_the_steps():
    cfg = task6_test.Config(hidden=8, heads=2, layers=3, vocab=10, batch=2, prompt=5, new_tokens=4)
    # steps feed positions 5, 6, 7 and read 6, 7, 8 tokens: mean 7 = prompt + new / 2
    assert task6_test.decode_kv_bytes(cfg, 4) == 2 * 3 * 2 * 7 * 8 * 4


def test_decode_profile_sorts_each_kernel_into_its_kind():
    """Demangled names as torch.profiler reports them: decode_linear_kernel<T, M, kGated, kSplits>."""
    kind = task6_test.profile_kind
    linear = "void (anonymous namespace)::decode_linear_kernel<{}>(T const*, T*, int, int)"
    assert kind(linear.format("__nv_bfloat16, 4, true, 2")) == "swiglu"
    assert kind(linear.format("__nv_bfloat16, 4, false, 2")) == "linear"
    assert kind(linear.format("float, 4, false, 4")) == "linear"
    assert kind("void (anonymous namespace)::decode_split_kernel<__half, true>(P)") == "attention"
    gqa = ("void (anonymous namespace)::decode_gqa_kernel<__nv_bfloat16, (anonymous namespace)::"
           "GqaConfig<128, 16, 3, 8>, (anonymous namespace)::ContiguousKv>(GqaParams, ContiguousKv)")
    assert kind(gqa) == "attention"   # the grouped-query model's decode (task 6's GQA configuration)
    assert kind("void (anonymous namespace)::norm_kernel<float, true>(NormParams<float>)") == "norm"
    assert kind("void (anonymous namespace)::rope_append_kernel<float>(P)") == "rope_append"
    assert kind("void at::native::vectorized_elementwise_kernel<4, FillFunctor<long>>") == "other"
