"""Task 6: a dummy decoder-only LLM that runs on our kernels end to end.

nanoGPT-style, one file, top to bottom:

    tokens [B, S] -> embedding -> num_layers x DecoderLayer -> LayerNorm -> lm_head -> logits
    DecoderLayer (pre-LN):  x = x + attn(ln1(x));  x = x + mlp(ln2(x))
    Attention:  q, k, v = biased projections of x; RoPE on q and k; attention; biased o_proj
    MLP (SwiGLU, width 4 * hidden):  down(silu(gate(x)) * up(x))

style="llama" is the same code as Llama, Mistral and Qwen configure it: RMSNorm instead of
LayerNorm, no biases, and grouped-query attention with num_kv_heads < num_heads (query head
h reads KV head h // (num_heads / num_kv_heads); the cache holds num_kv_heads heads).

Inference has two phases, and every call says which one it is by its input:

  * prefill: the whole prompt, tokens [B, S] (no cache, or a fresh one). The K and V of every
    prompt token go into the KV cache (task 5's update_kv_cache) and causal attention over the
    prompt runs on task 4's FlashAttention kernel. Big matrix products: compute-bound.
  * decode: one new token per sequence, tokens [B, 1], with the cache. Its K and V are written
    at position current_pos and task 5's decode kernel attends its query to the
    current_pos + 1 cached tokens. Every weight is read once to produce B tokens:
    memory-bound, which is why generate.py replays each decode step as one CUDA graph.

The cache is one (k_cache, v_cache) pair per layer, each [B, max_len, hidden] (token-major,
heads interleaved in hidden, as task 5 lays it out), allocated once per generation and written
in place, never re-allocated. RoPE is applied before the write, so it holds rotated keys.

Fused decode (fused_decode=True, the default, on our kernels): a decode step's small kernels
are merged (task5/fused.py): the norms run on one kernel each, RoPE on q and k and the cache
write of k and v on one (reading the position on the device), and the MLP's gate and up
products with silu(gate) * up on one pass of the streamed weights. Same math; fewer launches,
each of which costs a few microseconds even inside a CUDA graph. Fused prefill
(fused_prefill=True, the default): the prefill's RoPE and cache write run on the same
rope_append kernel (one pass over q, k and v instead of apply_rope's three kernels and the
cache copies), and its attention reads k and v back from the cache. With both False the model
runs the course's path (attend_custom below, task 6's apply_rope), which the tests check as well.

attention="torch" runs the same model on plain PyTorch (F.scaled_dot_product_attention and
tensor writes into the cache): the reference the tests compare against, and the path that
runs on a CPU. `model.attention_backend` switches between the two on the same weights.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from common import limits
from task5.ops import (
    AttentionOps,
    PageAllocator,
    kernel_ops,
    paged_attention,
    paged_rope_append,
    torch_ops,
)
from task6.rope import RotaryEmbedding, apply_rope

BACKENDS = ("custom", "torch")
STYLES = ("gpt", "llama")   # LayerNorm + biases (the course model), or RMSNorm, no biases, GQA
NORM_EPS = 1e-5

KVCache = list[tuple[torch.Tensor, torch.Tensor]]   # one (k_cache, v_cache) per layer


@dataclass
class PagedKVCache:
    """A paged KV cache (task 5's decode_paged.cu): one (k_pages, v_pages) per layer, each
    [num_pages, page_size, num_kv_heads, head_dim], and the allocator whose block table and
    lengths every layer shares (a sequence holds the same page ids in every layer)."""

    pages: list[tuple[torch.Tensor, torch.Tensor]]
    allocator: PageAllocator


def kernels() -> AttentionOps:
    """Task 4's and task 5's entry points (task5/ops.py), imported on first use (so this file
    imports on a machine without CUDA; the import builds or loads the extensions)."""
    return kernel_ops()


@dataclass
class StepInfo:
    """What every layer needs to know about one forward call, worked out once per call."""

    backend: str                       # "custom" (our kernels) or "torch"
    decode: bool                       # one token against the cache, or a prefill
    current_pos: int | torch.Tensor    # cache position of this call's first token
    seq_len: int | torch.Tensor        # tokens in the cache once this call's are written
    rope: RotaryEmbedding              # the whole RoPE tables (the fused kernel indexes them)
    cos: torch.Tensor | None           # [S, head_dim] RoPE tables at this call's positions
    sin: torch.Tensor | None           # (None on the fused decode path, which needs neither)
    fused: bool = False                # a decode step on our fused kernels (task5/fused.py)
    rope_append: bool = False          # RoPE + cache write on rope_append (fused decode or prefill)
    block_table: torch.Tensor | None = None   # a paged cache's (forward_paged; seq_len: [B] lengths)


def linear(layer: nn.Linear, x: torch.Tensor, step: StepInfo,
           residual: torch.Tensor | None = None) -> torch.Tensor:
    """layer(x) (+ residual). A decode step on our kernels reads every weight once for 4 token
    rows, so it is bound by memory; there task 5's decode_linear streams the weight at the
    bandwidth (cuBLAS does not at 4 rows) and adds the bias and the residual in the same pass."""
    if step.backend == "custom" and step.decode:
        return kernels().decode_linear(x, layer.weight, layer.bias, residual)
    out = layer(x)
    return out if residual is None else out + residual


def norm(layer: nn.LayerNorm | nn.RMSNorm, x: torch.Tensor, step: StepInfo) -> torch.Tensor:
    """layer(x): on the fused decode path, task 5's norm kernel (one read of x, fp32 sums)."""
    if step.fused:
        rms = isinstance(layer, nn.RMSNorm)
        return kernels().add_norm(x, layer.weight, None if rms else layer.bias, layer.eps, rms=rms)
    return layer(x)


def make_norm(hidden_dim: int, style: str) -> nn.Module:
    return nn.RMSNorm(hidden_dim, eps=NORM_EPS) if style == "llama" else nn.LayerNorm(hidden_dim, eps=NORM_EPS)


class Attention(nn.Module):
    def __init__(self, hidden_dim: int, num_heads: int, num_kv_heads: int, bias: bool = True):
        super().__init__()
        self.num_heads, self.num_kv_heads = num_heads, num_kv_heads
        self.head_dim = hidden_dim // num_heads
        # q, k and v projections stacked in one Linear (nanoGPT's c_attn): a decode step is
        # bound by reading weights, and one large matrix product reads them closer to the
        # memory bandwidth than three small ones, with two launches fewer. With GQA, k and v
        # have num_kv_heads heads each.
        qkv_features = (num_heads + 2 * num_kv_heads) * self.head_dim
        self.qkv_proj = nn.Linear(hidden_dim, qkv_features, bias=bias)
        self.o_proj = nn.Linear(hidden_dim, hidden_dim, bias=bias)

    def forward(self, x: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                step: StepInfo, residual: torch.Tensor) -> torch.Tensor:
        """residual + o_proj(attention(x))."""
        batch, seq, _ = x.shape
        heads, kv_heads = self.num_heads, self.num_kv_heads
        qkv = linear(self.qkv_proj, x, step).view(batch, seq, heads + 2 * kv_heads, self.head_dim)
        if step.block_table is not None:
            # A paged cache (k_cache, v_cache are this layer's pages): RoPE and the append into
            # the pages in one kernel, then causal attention through the block table.
            backend = "kernels" if step.backend == "custom" else "torch"
            q = paged_rope_append(qkv[:, :, :heads], qkv[:, :, heads:heads + kv_heads],
                                  qkv[:, :, heads + kv_heads:], k_cache, v_cache, step.block_table,
                                  step.rope.cos, step.rope.sin, step.seq_len, backend)
            out = paged_attention(q.transpose(1, 2), k_cache, v_cache, step.block_table,
                                  step.seq_len, backend)
            out = out.transpose(1, 2).reshape(batch, seq, heads * self.head_dim)
            return linear(self.o_proj, out, step, residual)
        if step.rope_append:
            # One kernel rotates q and k and writes k and v into the cache; then the attention,
            # with the keys and values read back from the cache.
            ops = kernels()
            q = ops.rope_append(qkv[:, :, :heads], qkv[:, :, heads:heads + kv_heads],
                                qkv[:, :, heads + kv_heads:], k_cache, v_cache, step.rope.cos,
                                step.rope.sin, step.current_pos)
            if step.decode:
                # rope_append, the kernel just before, wrote only the new position: the
                # attention may read the others while it runs (fresh_keys, task5/decode_gqa.cuh).
                out = ops.decode_attention(q.view(batch, 1, heads * self.head_dim), k_cache,
                                           v_cache, heads, step.seq_len, fresh_keys=seq)
            else:   # a prefill: the prompt, at position 0, is the cache's first `seq` rows
                k, v = (cache[:, :seq].view(batch, seq, kv_heads, self.head_dim).transpose(1, 2)
                        for cache in (k_cache, v_cache))
                out = ops.flash_attention(q.transpose(1, 2), k, v, causal=True)
                out = out.transpose(1, 2).reshape(batch, seq, heads * self.head_dim)
            return linear(self.o_proj, out, step, residual)
        # RoPE on the q and k heads together (one rotation, 3 kernels, for both); k is rotated
        # before it is cached. q, k, v are views [B, S, heads, head_dim] whose rows are 2 or 3
        # hidden apart: every kernel below takes strides, as long as the last dim is contiguous.
        qk = apply_rope(qkv[:, :, :heads + kv_heads], step.cos, step.sin)
        q, k, v = qk[:, :, :heads], qk[:, :, heads:], qkv[:, :, heads + kv_heads:]
        attend = self.attend_custom if step.backend == "custom" else self.attend_torch
        return linear(self.o_proj, attend(q, k, v, k_cache, v_cache, step), step, residual)

    def attend_custom(self, q, k, v, k_cache, v_cache, step: StepInfo) -> torch.Tensor:
        """Write k, v into the cache and attend, on task 4's and task 5's kernels.

        q: [B, S, heads, head_dim]; k, v: [B, S, kv_heads, head_dim] (kv_heads == heads but
        for grouped-query attention); views with a contiguous last dim (k already rotated).
        Returns [B, S, hidden].
        """
        # BEGIN SOLUTION
        # HINT: ops = kernels() holds the entry points. Both phases first write the new keys
        # HINT: and values into the cache at step.current_pos with ops.update_kv_cache (k, v as
        # HINT: [B, S, kv_heads * head_dim] views: k.flatten(2)).
        # HINT: Decode (step.decode, S == 1): ops.decode_attention(q as [B, 1, hidden], k_cache,
        # HINT: v_cache, self.num_heads, step.seq_len) attends to the first step.seq_len cached
        # HINT: tokens and returns [B, 1, hidden].
        # HINT: Prefill: ops.flash_attention(q, k, v, causal=True) takes [B, heads, S, head_dim]
        # HINT: views (transpose(1, 2), no copy) and returns [B, heads, S, head_dim]; transpose
        # HINT: back and reshape to [B, S, hidden].
        ops = kernels()
        batch, seq, heads, head_dim = q.shape
        hidden = heads * head_dim
        ops.update_kv_cache(k_cache, v_cache, k.flatten(2), v.flatten(2), step.current_pos)
        if step.decode:
            # The new token is the last one in the cache, so every cached token is in its past:
            # no mask is needed (causal=False), only the length, read on the device when it
            # is a tensor (a CUDA graph replays this call for every position).
            return ops.decode_attention(q.view(batch, 1, hidden), k_cache, v_cache, heads,
                                        step.seq_len)
        # Prefill attends the prompt to itself, straight from q, k, v (the cache now holds the
        # same k and v); transposes are views, the kernel takes any strides but the last.
        out = ops.flash_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                  causal=True)
        return out.transpose(1, 2).reshape(batch, seq, hidden)
        # END SOLUTION

    def attend_torch(self, q, k, v, k_cache, v_cache, step: StepInfo) -> torch.Tensor:
        """The same with the PyTorch twins of the kernels (task5/ops.py, torch_ops: tensor
        writes and F.scaled_dot_product_attention): the reference the custom path must match.

        A position and length that are tensors (CUDA graph) are read on the device; the decode
        then attends to the whole cache and masks the unwritten tail, so this path's caches
        are allocated with zeros (masked weights are 0, but 0 * NaN is NaN).
        """
        ops = torch_ops()
        batch, seq, heads, head_dim = q.shape
        hidden = heads * head_dim
        ops.update_kv_cache(k_cache, v_cache, k.flatten(2), v.flatten(2), step.current_pos)
        if step.decode:
            return ops.decode_attention(q.view(batch, 1, hidden), k_cache, v_cache, heads,
                                        step.seq_len)
        out = ops.flash_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                  causal=True)
        return out.transpose(1, 2).reshape(batch, seq, hidden)


class MLP(nn.Module):
    """SwiGLU: down(silu(gate(x)) * up(x)), width 4 * hidden."""

    def __init__(self, hidden_dim: int):
        super().__init__()
        self.width = 4 * hidden_dim
        # gate and up stacked in one Linear, for the same reason as qkv_proj.
        self.gate_up_proj = nn.Linear(hidden_dim, 2 * self.width, bias=False)
        self.down_proj = nn.Linear(self.width, hidden_dim, bias=False)

    def forward(self, x: torch.Tensor, step: StepInfo, residual: torch.Tensor) -> torch.Tensor:
        """residual + down(silu(gate(x)) * up(x))."""
        if step.fused:   # gate, up and silu(gate) * up in one pass over the stacked weights
            hidden = kernels().decode_swiglu(x, self.gate_up_proj.weight, self.gate_up_proj.bias)
        else:
            gate, up = linear(self.gate_up_proj, x, step).chunk(2, dim=-1)
            hidden = F.silu(gate) * up
        return linear(self.down_proj, hidden, step, residual)


class DecoderLayer(nn.Module):
    def __init__(self, hidden_dim: int, num_heads: int, num_kv_heads: int, style: str = "gpt"):
        super().__init__()
        self.ln1 = make_norm(hidden_dim, style)
        self.attn = Attention(hidden_dim, num_heads, num_kv_heads, bias=style == "gpt")
        self.ln2 = make_norm(hidden_dim, style)
        self.mlp = MLP(hidden_dim)

    def forward(self, x, k_cache, v_cache, step: StepInfo) -> torch.Tensor:
        x = self.attn(norm(self.ln1, x, step), k_cache, v_cache, step, residual=x)  # x + attn(ln1(x))
        return self.mlp(norm(self.ln2, x, step), step, residual=x)                 # x + mlp(ln2(x))


class customModel(nn.Module):
    """The dummy LLM (the course's name). Weights are seeded and drawn on `device` in `dtype`.

    attention: "custom" (task 4's and task 5's kernels, CUDA only) or "torch" (plain PyTorch,
    any device); `model.attention_backend` switches it later, on the same weights.
    device="meta" builds the shapes only (no memory), e.g. to count the parameters. Choose the
    dtype here: model.half() or .to(dtype) afterwards would also round the RoPE tables.
    style: "gpt" (LayerNorm, biases: the course model) or "llama" (RMSNorm, no biases);
    num_kv_heads: the K/V heads (default num_heads; fewer is grouped-query attention).
    fused_decode: decode steps on our fused kernels; fused_prefill: the prefill's RoPE and cache
    write on one (module docstring). `model.fused_decode` and `model.fused_prefill` switch them
    later; both False is the course's path.
    """

    def __init__(self, hidden_dim: int, num_heads: int, num_layers: int, vocab_size: int,
                 max_seq_len: int = 4096, attention: str = "custom", *, device=None,
                 dtype: torch.dtype = torch.float32, seed: int = 0, style: str = "gpt",
                 num_kv_heads: int | None = None, fused_decode: bool = True,
                 fused_prefill: bool = True):
        super().__init__()
        num_kv_heads = num_heads if num_kv_heads is None else num_kv_heads
        for name, value in (("hidden_dim", hidden_dim), ("num_heads", num_heads),
                            ("num_layers", num_layers), ("vocab_size", vocab_size),
                            ("max_seq_len", max_seq_len), ("num_kv_heads", num_kv_heads)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a positive int (got {value!r}).")
        if style not in STYLES:
            raise ValueError(f"style must be one of {STYLES} (got {style!r}).")
        if num_heads % num_kv_heads != 0:
            raise ValueError(f"num_kv_heads {num_kv_heads} must divide num_heads {num_heads} "
                             "(each KV head serves a group of query heads).")
        if hidden_dim % num_heads != 0:
            raise ValueError(f"hidden_dim {hidden_dim} is not divisible by num_heads {num_heads}.")
        if (hidden_dim // num_heads) % 2 != 0:
            raise ValueError(f"head_dim = hidden_dim / num_heads = {hidden_dim // num_heads} must "
                             "be even: RoPE rotates pairs of coordinates.")
        if dtype not in (torch.float32, torch.float16, torch.bfloat16, torch.float64):
            raise TypeError(f"dtype must be float32, float16 or bfloat16 (float64 too, for "
                            f"references on the torch path), got {dtype}.")
        self.hidden_dim, self.num_heads, self.num_layers = hidden_dim, num_heads, num_layers
        self.num_kv_heads, self.style, self.fused_decode = num_kv_heads, style, bool(fused_decode)
        self.fused_prefill = bool(fused_prefill)
        self.head_dim = hidden_dim // num_heads
        self.kv_hidden = num_kv_heads * self.head_dim   # features of a cache row
        self.vocab_size, self.max_seq_len = vocab_size, max_seq_len
        self.attention_backend = attention
        device = torch.device(device) if device is not None else torch.device("cpu")

        # Shapes first, on the meta device (no memory, no default init), then storage on the
        # target device in the target dtype, then one seeded init there: the 6.5 G parameters
        # of the course model are drawn once, on the GPU, never initialised on the CPU first.
        with torch.device("meta"):
            self.embed = nn.Embedding(vocab_size, hidden_dim)
            self.layers = nn.ModuleList(DecoderLayer(hidden_dim, num_heads, num_kv_heads, style)
                                        for _ in range(num_layers))
            self.ln_f = make_norm(hidden_dim, style)
            self.lm_head = nn.Linear(hidden_dim, vocab_size, bias=False)
        self.to(dtype=dtype)
        self.to_empty(device=device)
        if device.type != "meta":
            self._init_weights(seed)
        self.rope = RotaryEmbedding(self.head_dim, max_seq_len, device=device)
        self.requires_grad_(False)   # inference only
        self.eval()

    @torch.no_grad()
    def _init_weights(self, seed: int) -> None:
        """GPT-2's init: N(0, 0.02), residual projections (o_proj, down_proj) scaled by
        1/sqrt(2 * num_layers) so the residual stream does not grow with depth. Biases are
        drawn too (not zero), so a bias dropped somewhere shows in the tests; norms start as
        the identity."""
        gen = torch.Generator(device=self.embed.weight.device)
        gen.manual_seed(seed)
        residual_std = 0.02 / math.sqrt(2 * self.num_layers)
        for name, module in self.named_modules():
            if isinstance(module, (nn.LayerNorm, nn.RMSNorm)):
                module.weight.fill_(1.0)
                if getattr(module, "bias", None) is not None:
                    module.bias.zero_()
            elif isinstance(module, (nn.Linear, nn.Embedding)):
                std = residual_std if name.endswith(("o_proj", "down_proj")) else 0.02
                module.weight.normal_(0.0, std, generator=gen)
                if getattr(module, "bias", None) is not None:
                    module.bias.normal_(0.0, 0.02, generator=gen)

    # --- configuration ----------------------------------------------------------------------

    @property
    def attention_backend(self) -> str:
        return self._attention_backend

    @attention_backend.setter
    def attention_backend(self, name: str) -> None:
        if name not in BACKENDS:
            raise ValueError(f"attention must be one of {BACKENDS} (got {name!r}).")
        head_dim = self.hidden_dim // self.num_heads
        if name == "custom" and not limits.supports(head_dim):
            raise ValueError(
                f"attention='custom' runs kernels that take a head_dim {limits.describe()}, but "
                f"hidden_dim / num_heads = {head_dim}; use more heads, or attention='torch'.")
        self._attention_backend = name

    @property
    def device(self) -> torch.device:
        return self.embed.weight.device

    @property
    def dtype(self) -> torch.dtype:
        return self.embed.weight.dtype

    def allocate_kv_cache(self, batch: int, max_len: int | None = None) -> KVCache:
        """One (k_cache, v_cache) per layer, each [batch, max_len, kv_hidden] (kv_hidden =
        num_kv_heads * head_dim: hidden, but for grouped-query attention): once per generation.

        The custom path allocates through task 5; the torch path with zeros (its CUDA-graph
        decode reads the unwritten tail under a mask, which must not be NaN).
        """
        max_len = self.max_seq_len if max_len is None else max_len
        if not 1 <= max_len <= self.max_seq_len:
            raise ValueError(f"max_len {max_len} must be in [1, max_seq_len = {self.max_seq_len}] "
                             "(RoPE tables cover max_seq_len positions).")
        if batch < 1:
            raise ValueError(f"batch must be >= 1 (got {batch}).")
        ops = kernels() if self.attention_backend == "custom" else torch_ops()
        return [ops.allocate_kv_cache(batch, max_len, self.kv_hidden, self.dtype, self.device)
                for _ in range(self.num_layers)]

    def allocate_paged_kv_cache(self, batch: int, num_pages: int, page_size: int = 16,
                                max_len: int | None = None, shuffle: int | None = None) -> PagedKVCache:
        """A paged cache of num_pages pages of page_size tokens per layer (zeros), for `batch`
        sequences of at most max_len tokens (default max_seq_len) each; pages are handed out by
        its allocator (task5.ops.PageAllocator; `shuffle`: a seed for a random order)."""
        max_len = self.max_seq_len if max_len is None else max_len
        if not 1 <= max_len <= self.max_seq_len:
            raise ValueError(f"max_len {max_len} must be in [1, max_seq_len = {self.max_seq_len}] "
                             "(RoPE tables cover max_seq_len positions).")
        allocator = PageAllocator(num_pages, page_size, batch, -(-max_len // page_size),
                                  device=self.device, shuffle=shuffle)
        shape = (num_pages, page_size, self.num_kv_heads, self.head_dim)
        pages = [(torch.zeros(shape, dtype=self.dtype, device=self.device),
                  torch.zeros(shape, dtype=self.dtype, device=self.device))
                 for _ in range(self.num_layers)]
        return PagedKVCache(pages, allocator)

    def forward_paged(self, tokens: torch.Tensor, cache: PagedKVCache, seq_lens: torch.Tensor,
                      block_table: torch.Tensor | None = None, *,
                      last_logits_only: bool = False) -> torch.Tensor:
        """tokens [B, S] (S <= 16 on the kernels: a decode step, or a chunk of a prompt) at
        positions seq_lens[b] - S .. seq_lens[b] - 1 of each sequence of the paged cache;
        seq_lens: [B] int32 on the model's device, each sequence's length once these tokens are
        in (read on the device: a CUDA graph replays this call as they grow). Their pages must
        be allocated (cache.allocator). block_table: the allocator's, or rows of it (a prompt
        run for one sequence). Returns the logits [B, S, vocab] ([B, 1, vocab] with
        last_logits_only). A sequence of length 0 (freed) gives meaningless logits and writes
        nothing."""
        batch, seq = self._check_tokens(tokens)
        custom = self.attention_backend == "custom"
        if custom and self.dtype not in (torch.float16, torch.bfloat16):
            raise TypeError(f"the paged cache runs on tensor cores in float16 or bfloat16, but "
                            f"the model computes in {self.dtype}; build it with dtype=torch."
                            "bfloat16, or use attention='torch'.")
        table = cache.allocator.block_table if block_table is None else block_table
        if table.shape[0] != batch or tuple(seq_lens.shape) != (batch,):
            raise ValueError(f"tokens hold {batch} sequences but block_table has "
                             f"{table.shape[0]} rows and seq_lens shape {tuple(seq_lens.shape)}.")
        if len(cache.pages) != self.num_layers:
            raise ValueError(f"the paged cache has {len(cache.pages)} layers of pages but the "
                             f"model {self.num_layers}; allocate it with model.allocate_paged_kv_cache.")
        decode = seq == 1
        step = StepInfo(backend=self.attention_backend, decode=decode, current_pos=seq_lens - seq,
                        seq_len=seq_lens, rope=self.rope, cos=None, sin=None,
                        fused=decode and self.fused_decode and custom, block_table=table)
        x = self.embed(tokens)
        for layer, (k_pages, v_pages) in zip(self.layers, cache.pages, strict=True):
            x = layer(x, k_pages, v_pages, step)
        x = norm(self.ln_f, x, step)
        if last_logits_only:
            x = x[:, -1:]
        return linear(self.lm_head, x, step)

    # --- the forward pass -------------------------------------------------------------------

    def forward(self, tokens: torch.Tensor, kv_cache: KVCache | None = None,
                current_pos: int | torch.Tensor = 0, *,
                last_logits_only: bool = False) -> tuple[torch.Tensor, KVCache]:
        """Prefill or one decode step; returns (logits, kv_cache).

        tokens [B, S] (int64). Prefill: any S with no cache (one of max_seq_len positions is
        allocated) or with a preallocated one, current_pos 0. Decode: S == 1 with a cache,
        current_pos = the new token's position (a Python int, or a 0-d int32 tensor on the
        model's device, which a CUDA graph reads on the device and which is not bounds-checked
        here: the caller keeps it inside the cache). Logits: [B, S, vocab], or [B, 1, vocab]
        for the last position only with last_logits_only=True.
        """
        batch, seq = self._check_tokens(tokens)
        decode = kv_cache is not None and seq == 1
        if kv_cache is None:
            kv_cache = self.allocate_kv_cache(batch)
        cache_len = self._check_cache(kv_cache, batch)
        self._check_position(current_pos, decode, seq, cache_len, tokens)
        if not decode or (isinstance(current_pos, int) and current_pos == 0):
            # One sync per prefill (a 1-token prompt into a given cache counts), none per
            # decode step: decode steps feed back ids that argmax chose, always in range.
            self._check_token_range(tokens)

        custom = self.attention_backend == "custom"
        fused = decode and self.fused_decode and custom
        rope_append = fused or (not decode and self.fused_prefill and custom)
        cos, sin = (None, None) if rope_append else self.rope.at(current_pos, seq, self.dtype)
        step = StepInfo(backend=self.attention_backend, decode=decode, current_pos=current_pos,
                        seq_len=current_pos + seq, rope=self.rope, cos=cos, sin=sin, fused=fused,
                        rope_append=rope_append)
        x = self.embed(tokens)
        for layer, (k_cache, v_cache) in zip(self.layers, kv_cache, strict=True):
            x = layer(x, k_cache, v_cache, step)
        x = norm(self.ln_f, x, step)
        if last_logits_only:
            x = x[:, -1:]
        return linear(self.lm_head, x, step), kv_cache

    # --- input checks: a clear Python error instead of a kernel fault --------------------------

    def _check_tokens(self, tokens) -> tuple[int, int]:
        if not isinstance(tokens, torch.Tensor):
            raise TypeError(f"tokens must be a tensor of token ids [batch, seq], got {type(tokens).__name__}.")
        if tokens.dtype not in (torch.int64, torch.int32):
            raise TypeError(f"tokens must hold integer token ids (int64), but have dtype {tokens.dtype}.")
        if tokens.dim() != 2:
            raise ValueError(f"tokens must be [batch, seq] but have shape {tuple(tokens.shape)}.")
        if tokens.numel() == 0:
            raise ValueError(f"tokens is empty (shape {tuple(tokens.shape)}); pass at least one token.")
        if tokens.device != self.device:
            raise ValueError(f"tokens are on {tokens.device} but the model is on {self.device}; "
                             "move them with .to(model.device).")
        if self.attention_backend == "custom":
            self._check_kernel_device()
        return tokens.shape[0], tokens.shape[1]

    def _check_kernel_device(self) -> None:
        if self.device.type != "cuda":
            raise ValueError("attention='custom' runs the CUDA kernels of tasks 4 and 5, but the "
                             f"model is on {self.device}; build it on a GPU or use attention='torch'.")

    def _check_token_range(self, tokens: torch.Tensor) -> None:
        # An id outside the vocabulary would be an out-of-bounds read in the embedding (on a
        # GPU, a device-side assert that kills the process).
        if ((tokens < 0) | (tokens >= self.vocab_size)).any().item():
            raise ValueError(f"token ids must be in [0, vocab_size = {self.vocab_size}); got "
                             f"min {tokens.min().item()}, max {tokens.max().item()}.")

    def _check_cache(self, kv_cache, batch: int) -> int:
        if not isinstance(kv_cache, (list, tuple)) or len(kv_cache) != self.num_layers:
            raise ValueError(f"kv_cache must be a list of {self.num_layers} (k_cache, v_cache) pairs "
                             "(one per layer), as model.allocate_kv_cache returns.")
        cache_len = None
        for i, pair in enumerate(kv_cache):
            if not isinstance(pair, (list, tuple)) or len(pair) != 2:
                raise ValueError(f"kv_cache[{i}] must be a (k_cache, v_cache) pair.")
            for name, t in zip(("k_cache", "v_cache"), pair, strict=True):
                if not isinstance(t, torch.Tensor) or t.dim() != 3 or t.shape[0] != batch \
                        or t.shape[2] != self.kv_hidden:
                    shape = tuple(t.shape) if isinstance(t, torch.Tensor) else type(t).__name__
                    raise ValueError(f"kv_cache[{i}] {name} must be [batch {batch}, max_len, "
                                     f"kv_hidden {self.kv_hidden}] but is {shape}.")
                if t.dtype != self.dtype:
                    raise TypeError(f"kv_cache[{i}] {name} has dtype {t.dtype} but the model "
                                    f"computes in {self.dtype}; allocate it with model.allocate_kv_cache.")
                if t.device != self.device:
                    raise ValueError(f"kv_cache[{i}] {name} is on {t.device} but the model is on "
                                     f"{self.device}.")
                cache_len = t.shape[1] if cache_len is None else cache_len
                if t.shape[1] != cache_len:
                    raise ValueError(f"kv_cache[{i}] {name} holds {t.shape[1]} positions but "
                                     f"kv_cache[0] holds {cache_len}; every layer needs the same length.")
        return min(cache_len, self.max_seq_len)

    def _check_position(self, current_pos, decode: bool, seq: int, cache_len: int, tokens) -> None:
        if isinstance(current_pos, torch.Tensor):
            if not decode:
                raise ValueError("a tensor current_pos is for decode steps (tokens [B, 1] with a "
                                 "cache); a prefill starts at position 0, a Python int.")
            if current_pos.dtype != torch.int32 or current_pos.numel() != 1:
                raise TypeError(f"a tensor current_pos must be one int32 value, got dtype "
                                f"{current_pos.dtype} and shape {tuple(current_pos.shape)}.")
            if current_pos.device != tokens.device:
                raise ValueError(f"current_pos is on {current_pos.device} but tokens are on "
                                 f"{tokens.device}.")
            return
        if isinstance(current_pos, bool) or not isinstance(current_pos, int):
            raise TypeError(f"current_pos must be an int or an int32 tensor, got {type(current_pos).__name__}.")
        if not decode and current_pos != 0:
            raise ValueError(f"a prefill (tokens [B, S>1] or no cache) starts at position 0, got "
                             f"current_pos {current_pos}: task 4's kernel attends a sequence to "
                             "itself; to extend a sequence, decode one token at a time.")
        if current_pos < 0 or current_pos + seq > cache_len:
            raise ValueError(f"tokens at positions [{current_pos}, {current_pos + seq}) do not fit "
                             f"in a cache of {cache_len} positions; allocate a longer one.")
