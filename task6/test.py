"""Task 6 test: the dummy LLM on our kernels, against the same model on plain PyTorch.

    python -m task6.test                          # every group; course runs fp32 and bf16
    python -m task6.test --correctness            # our path vs the PyTorch path, small model
    python -m task6.test --correctness --course-correctness   # ... and at the course size
    python -m task6.test --course --dtype bf16    # TTFT / TBT at the course size, bf16 only
    python -m task6.test --course --hidden 1024 --layers 4    # a smaller model
    python -m task6.test --small                  # tiny shapes, every dtype (compute-sanitizer)
    python -m task6.test --gqa-course             # the course model with 8 KV heads, bf16 (issue 32)
    python -m task6.test --inputs                 # bad input raises a clear error

Course configuration: B 4, prompt 1024, hidden 4096, 32 heads, 24 layers, vocab 8192,
100 greedy tokens, fp32 (6.5 G parameters, 26 GB).

Correctness first. The "torch" path is the same model, same weights, with
F.scaled_dot_product_attention and tensor writes into the cache instead of our kernels.
Prefill logits must agree, greedy tokens must be identical for 20 steps, every decode
step's logits must match the logits a one-shot prefill over the same tokens gives (the
cache is right only if both agree), a second run on a NaN-poisoned cache must give the
same bits (a kernel that reads past the cached length, or races, cannot), and in fp16 /
bf16 our error against a higher-precision run of the same weights must stay within 2x of
PyTorch's own half-precision path.

Then speed, beside the physical limits measured in the same run: a decode step must read
every weight once, so TBT >= weight bytes / copy bandwidth (the "roofline"; acceptance:
TBT <= 1.5 x that); the prefill is matrix products, so TTFT >= its FLOPs / the cuBLAS
matmul rate of the dtype.
"""

from __future__ import annotations

if not __package__:  # run as a file, where `common` cannot be imported
    raise SystemExit("Run this from the repository root as a module: python -m task6.test")

import gc
import sys
from contextlib import contextmanager
from dataclasses import dataclass, replace

import torch

from common.checks import REL_TOL, Check, check_raises, poison_, relative_error
from common.harness import fresh_generator, pick_device, task_main
from common.timing import (attention_flops, interleaved_medians, measure_copy_bandwidth,
                           measure_matmul_tflops, time_cuda)
from task6.generate import generate
from task6.manifest import (GQA_CONFIG, PROFILE_KINDS, TBT_MS, TBT_OVER_BYTES, TBT_OVER_ROOFLINE,
                            TTFT_MS, TTFT_ROUNDS, UNFUSED_TBT_MS, course_metric, profile_metric)
from task6.model import customModel

DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}
WEIGHT_SEED = 6
TOKEN_SEED = 6            # prompts of the greedy-token check: seeded, so a pass is reproducible
GREEDY_STEPS = 20
# fp32 logits, our path vs the PyTorch path (or float64). The two paths run the very same
# projections and MLP (identical cuBLAS calls); only attention differs, by ~1e-6 relative
# (our kernel's fp32 online softmax vs SDPA's). Carried through the layers and LayerNorms,
# that stays ~1e-6..1e-5 in the logits. A wrong mask, position, RoPE or cache entry moves
# them by 1e-2 or more, so 1e-4 separates the two with room on both sides.
FP32_LOGITS_TOL = 1e-4
# fp16/bf16: rounding at every layer dominates, and PyTorch's own path in the same dtype
# has it too. Ours passes when its error against a higher-precision run of the same
# weights is within 2x of PyTorch's (different rounding order), or under REL_TOL[dtype].
HALF_MARGIN = 2.0
ACCEPT_TBT_OVER_ROOFLINE = 1.5
TARGET_TBT_OVER_BYTES = 1.10      # beyond the course: the fused decode (issue 16)
PROFILE_STEPS = 8


@dataclass(frozen=True)
class Config:
    hidden: int
    heads: int
    layers: int
    vocab: int
    batch: int
    prompt: int
    new_tokens: int
    style: str = "gpt"             # "llama": RMSNorm, no biases (task6/model.py)
    kv_heads: int | None = None    # fewer than heads: grouped-query attention

    @property
    def label(self) -> str:
        extra = (f"_{self.style}" if self.style != "gpt" else "") + (
            f"_kv{self.kv_heads}" if self.kv_heads not in (None, self.heads) else "")
        return (f"b{self.batch}_p{self.prompt}_h{self.hidden}_nh{self.heads}_l{self.layers}"
                f"_v{self.vocab}_n{self.new_tokens}{extra}")

    def describe(self) -> str:
        extra = (f", {self.style} style" if self.style != "gpt" else "") + (
            f", {self.kv_heads} KV heads" if self.kv_heads not in (None, self.heads) else "")
        return (f"B {self.batch}, prompt {self.prompt}, hidden {self.hidden}, {self.heads} heads, "
                f"{self.layers} layers, vocab {self.vocab}, {self.new_tokens} new tokens{extra}")

    def build(self, dtype, device, attention: str = "custom", seed: int = WEIGHT_SEED) -> customModel:
        # max_seq_len = what a generation needs, so a prefill without a cache allocates no more.
        return customModel(self.hidden, self.heads, self.layers, self.vocab,
                           max_seq_len=self.prompt + self.new_tokens, attention=attention,
                           device=device, dtype=dtype, seed=seed, style=self.style,
                           num_kv_heads=self.kv_heads)

    def prompt_tokens(self, generator, device) -> torch.Tensor:
        return torch.randint(0, self.vocab, (self.batch, self.prompt), generator=generator,
                             device=device)


COURSE = Config(hidden=4096, heads=32, layers=24, vocab=8192, batch=4, prompt=1024, new_tokens=100)
# Issue 32's grouped-query configuration: the course model with its 32 query heads sharing 8 KV
# heads (Llama-3 8B's ratio), in bf16; recorded as task6.<GQA_CONFIG>.bf16.* (task6/manifest.py).
GQA_COURSE = replace(COURSE, kv_heads=8)
SMALL = Config(hidden=512, heads=8, layers=4, vocab=1024, batch=2, prompt=64, new_tokens=GREEDY_STEPS)
# The same size in the Llama style (RMSNorm, no biases, 8 query heads sharing 2 KV heads).
LLAMA_SMALL = Config(hidden=512, heads=8, layers=4, vocab=1024, batch=2, prompt=64,
                     new_tokens=GREEDY_STEPS, style="llama", kv_heads=2)
# Tiny models for compute-sanitizer: head_dim 8, 64 and 128; prompts that are not multiples
# of any tile; batch 1 to 3.
TINY = (Config(32, 4, 2, 97, 2, 13, 6), Config(128, 2, 2, 97, 3, 13, 6),
        Config(256, 2, 1, 61, 1, 70, 5), Config(128, 4, 2, 97, 2, 13, 6, style="llama", kv_heads=2))


# --- helpers ------------------------------------------------------------------------------

def reference_copy(model: customModel, dtype: torch.dtype) -> customModel:
    """The same weights on the PyTorch path in a higher precision (float64: the truth)."""
    ref = customModel(model.hidden_dim, model.num_heads, model.num_layers, model.vocab_size,
                      max_seq_len=model.max_seq_len, attention="torch", device=model.device,
                      dtype=dtype, style=model.style, num_kv_heads=model.num_kv_heads)
    ref.load_state_dict(model.state_dict())   # copy_ converts the dtype, exactly (upcast)
    return ref


def teacher_forced_logits(ref: customModel, prompt: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
    """What each generation step's logits must be: one prefill over the prompt and every
    generated token but the last; position P - 1 + i predicts new token i. [B, new, vocab]."""
    logits, _ = ref(torch.cat([prompt, tokens[:, :-1]], dim=1))
    return logits[:, prompt.shape[1] - 1:]


def first_divergence(a: torch.Tensor, b: torch.Tensor) -> int | None:
    """The first step at which two [B, n] token tensors differ (in any sequence), or None."""
    differs = (a != b).any(dim=0).nonzero()
    return None if differs.numel() == 0 else int(differs[0])


def top2_margin(logits: torch.Tensor) -> float:
    """The smallest gap between the best and second-best logit: how close greedy was to a tie."""
    top = logits.float().topk(2, dim=-1).values
    return float((top[..., 0] - top[..., 1]).min())


def poisoned_cache(model: customModel, batch: int, length: int):
    cache = model.allocate_kv_cache(batch, length)
    for k_cache, v_cache in cache:
        poison_(k_cache)
        poison_(v_cache)
    return cache


def free_gpu_memory() -> None:
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def _needs_gpu(group: str, device) -> tuple[list[Check], dict] | None:
    if device.type == "cuda":
        return None
    return [Check(group, False, "needs an NVIDIA GPU: the custom path runs the task 4 and "
                  f"task 5 CUDA kernels, and this run is on {device}")], {}


def _guard(group: str, body):
    """Run a group; a solution region not written yet fails its checks instead of crashing."""
    try:
        return body()
    except NotImplementedError as err:
        return [Check(group, False, f"not implemented: {err}")], {}


def _dtypes(args) -> list[str]:
    names = [n.strip() for n in (getattr(args, "dtype", None) or "fp32,bf16").split(",") if n.strip()]
    unknown = [n for n in names if n not in DTYPES]
    if unknown:
        raise ValueError(f"--dtype takes a comma-separated list of {sorted(DTYPES)}, got {unknown}.")
    return names


def _course_config(args) -> Config:
    fields = {f: getattr(args, f, None) for f in ("hidden", "heads", "layers", "vocab", "batch",
                                                   "prompt", "new_tokens")}
    cfg = Config(**{f: (v if v is not None else getattr(COURSE, f)) for f, v in fields.items()})
    if cfg.new_tokens < 2:
        raise ValueError("--new-tokens must be >= 2: TBT is measured over the decode steps after "
                         "the first token.")
    return cfg


# --- correctness ----------------------------------------------------------------------------

@contextmanager
def fused_kernels(model: customModel, on: bool):
    """Within the block, the model runs on task 5's fused kernels (decode steps, and the
    prefill's RoPE and cache write) or, with on=False, on the course's path: the student's
    attend_custom and apply_rope in both phases. The settings before are restored after."""
    before = model.fused_decode, model.fused_prefill
    model.fused_decode = model.fused_prefill = on
    try:
        yield
    finally:
        model.fused_decode, model.fused_prefill = before


def _fp32_agreement(cfg: Config, device, gen, token_seed: int, with_fp64: bool):
    """Our path vs the PyTorch path on the same fp32 weights: prefill logits and cache, greedy
    tokens and every decode step's logits (graph on and off), bit-for-bit repeat."""
    checks: list[Check] = []
    metrics: dict[str, float] = {}
    tag = {SMALL: "small", LLAMA_SMALL: "llama_small", COURSE: "course"}.get(cfg, cfg.label)
    model = cfg.build(torch.float32, device)
    batch, prompt_len, n = cfg.batch, cfg.prompt, GREEDY_STEPS

    # Prefill logits at every position, and what it left in the cache (rotated K, and V).
    prompt = cfg.prompt_tokens(gen, device)
    results = {}
    for backend in ("custom", "torch"):
        model.attention_backend = backend
        cache = model.allocate_kv_cache(batch, prompt_len)
        logits, _ = model(prompt, cache)
        results[backend] = (logits, cache[-1])   # the last layer's cache: errors add up there
    model.attention_backend = "custom"
    (ours, (k_ours, v_ours)), (theirs, (k_theirs, v_theirs)) = results["custom"], results["torch"]
    err = relative_error(ours, theirs.double())
    metrics[f"task6.correctness.{tag}.fp32.prefill_rel_err_vs_torch"] = err
    checks.append(Check(f"{tag} fp32 prefill logits vs torch path", err <= FP32_LOGITS_TOL,
                        f"rel_err {err:.2e} (tol {FP32_LOGITS_TOL:.0e})"))
    cache_err = max(relative_error(k_ours, k_theirs.double()), relative_error(v_ours, v_theirs.double()))
    checks.append(Check(f"{tag} fp32 prefill KV cache (last layer) vs torch path",
                        cache_err <= FP32_LOGITS_TOL, f"rel_err {cache_err:.2e}"))
    del results, ours, theirs, k_ours, v_ours, k_theirs, v_theirs
    if with_fp64:
        ref = reference_copy(model, torch.float64)
        truth, _ = ref(prompt)
        model.attention_backend = "torch"
        torch_err = relative_error(model(prompt)[0], truth)
        model.attention_backend = "custom"
        err = relative_error(model(prompt)[0], truth)
        checks.append(Check(f"{tag} fp32 prefill logits vs float64", err <= FP32_LOGITS_TOL,
                            f"rel_err {err:.2e} (torch path {torch_err:.2e}, tol {FP32_LOGITS_TOL:.0e})"))
        del ref, truth

    # Greedy generation on a seeded prompt: the PyTorch path (eager) is the reference.
    token_gen = torch.Generator(device=device)
    token_gen.manual_seed(token_seed)
    prompt = cfg.prompt_tokens(token_gen, device)
    model.attention_backend = "torch"
    ref_tokens, ref_logits = generate(model, prompt, n, use_cuda_graph=False, return_logits=True)
    model.attention_backend = "custom"
    margin = top2_margin(ref_logits)
    runs = {}
    # The fused decode kernels (the default) with and without a graph, and the course's path
    # (task 6's attend_custom and apply_rope) in a graph.
    for graph, fused in ((True, True), (False, True), (True, False)):
        mode = ("CUDA graph" if graph else "eager") + ("" if fused else ", unfused")
        with fused_kernels(model, fused):   # unfused: the course's path
            tokens, logits = generate(model, prompt, n, use_cuda_graph=graph, return_logits=True)
        runs[(graph, fused)] = (tokens, logits)
        split = first_divergence(tokens, ref_tokens)
        checks.append(Check(
            f"{tag} fp32 greedy tokens, {n} steps ({mode}) == torch path", split is None,
            "identical" if split is None else
            f"differ from step {split} (top-2 logit gap there on the torch path: "
            f"{top2_margin(ref_logits[:, split]):.2e}; smallest over all steps {margin:.2e})"))
        # Logits up to and including the first divergence were computed from the same tokens.
        upto = n if split is None else split + 1
        err = relative_error(logits[:, 1:upto], ref_logits[:, 1:upto].double()) if upto > 1 else 0.0
        metrics[f"task6.correctness.{tag}.fp32.decode_rel_err_vs_torch.{'graph' if graph else 'eager'}"
                + ("" if fused else ".unfused")] = err
        checks.append(Check(f"{tag} fp32 decode-step logits ({mode}) vs torch path",
                            err <= FP32_LOGITS_TOL, f"rel_err {err:.2e} over {upto - 1} steps"))

    # The same generation again on a cache full of NaN: the same bits, or a kernel read a
    # position it had not written (past the cached length) or raced.
    tokens, logits = generate(model, prompt, n, use_cuda_graph=True, return_logits=True,
                              kv_cache=poisoned_cache(model, batch, prompt_len + n))
    first = runs[(True, True)]
    same = torch.equal(tokens, first[0]) and torch.equal(logits, first[1])
    checks.append(Check(f"{tag} fp32 repeat on a NaN-poisoned cache is bit-identical", same,
                        "" if same else f"max |diff| {(logits.double() - first[1].double()).abs().max().item():.2e}"))
    del model, runs
    free_gpu_memory()
    return checks, metrics


def _agreement_vs_reference(cfg: Config, dtype: torch.dtype, device, gen, ref_dtype: torch.dtype,
                            tag: str, graphs=(True, False)):
    """Our path in `dtype` against the same weights on the PyTorch path in `ref_dtype`: the
    prefill logits (every position) and each generation step's logits (teacher-forced), graph
    on and off; plus a bit-for-bit repeat on a NaN-poisoned cache."""
    checks: list[Check] = []
    metrics: dict[str, float] = {}
    name = next(k for k, v in DTYPES.items() if v == dtype)
    ref_name = {torch.float64: "float64", torch.float32: "fp32"}[ref_dtype]
    model = cfg.build(dtype, device)
    ref = reference_copy(model, ref_dtype)
    prompt = cfg.prompt_tokens(gen, device)
    n = cfg.new_tokens
    truth, _ = ref(prompt)

    def tolerance(torch_err: float) -> float:
        return FP32_LOGITS_TOL if dtype == torch.float32 else max(HALF_MARGIN * torch_err, REL_TOL[dtype])

    # The PyTorch path in the same dtype: the error a correct implementation has.
    model.attention_backend = "torch"
    torch_prefill_err = relative_error(model(prompt)[0], truth)
    torch_tokens, torch_logits = generate(model, prompt, n, use_cuda_graph=False, return_logits=True)
    torch_decode_err = relative_error(torch_logits, teacher_forced_logits(ref, prompt, torch_tokens))
    model.attention_backend = "custom"

    err = relative_error(model(prompt)[0], truth)
    tol = tolerance(torch_prefill_err)
    metrics[f"task6.correctness.{tag}.{name}.prefill_rel_err"] = err
    checks.append(Check(f"{tag} {name} prefill logits vs {ref_name} reference", err <= tol,
                        f"rel_err {err:.2e} (torch path {torch_prefill_err:.2e}, tol {tol:.1e})"))
    first_run = None
    for graph, fused in [(g, True) for g in graphs] + [(graphs[0], False)]:
        mode = ("CUDA graph" if graph else "eager") + ("" if fused else ", unfused")
        with fused_kernels(model, fused):   # unfused: the course's path
            tokens, logits = generate(model, prompt, n, use_cuda_graph=graph, return_logits=True)
        if graph and fused:
            first_run = (tokens, logits)
        err = relative_error(logits, teacher_forced_logits(ref, prompt, tokens))
        tol = tolerance(torch_decode_err)
        metrics[f"task6.correctness.{tag}.{name}.generate_rel_err.{'graph' if graph else 'eager'}"
                + ("" if fused else ".unfused")] = err
        checks.append(Check(f"{tag} {name} generation logits ({mode}, {n} tokens) vs {ref_name} "
                            "reference", err <= tol,
                            f"rel_err {err:.2e} (torch path {torch_decode_err:.2e}, tol {tol:.1e})"))
    if first_run is not None:
        tokens, logits = generate(model, prompt, n, use_cuda_graph=True, return_logits=True,
                                  kv_cache=poisoned_cache(model, cfg.batch, cfg.prompt + n))
        same = torch.equal(tokens, first_run[0]) and torch.equal(logits, first_run[1])
        checks.append(Check(f"{tag} {name} repeat on a NaN-poisoned cache is bit-identical", same))
    del model, ref
    free_gpu_memory()
    return checks, metrics


def correctness_group(args=None):
    """Our kernels vs the PyTorch path on the same weights (small model; course size on request)."""
    device = pick_device(getattr(args, "device", None))
    if (fail := _needs_gpu("correctness", device)) is not None:
        return fail
    seed = getattr(args, "seed", None)
    gen, seed = fresh_generator(seed, device)
    token_seed = TOKEN_SEED if getattr(args, "seed", None) is None else seed
    configs = [SMALL, LLAMA_SMALL] + ([COURSE] if getattr(args, "course_correctness", False) else [])

    def body():
        checks, metrics = [], {}
        for cfg in configs:
            print(f"[task6] correctness: {cfg.describe()}; weights seed {WEIGHT_SEED}, inputs seed "
                  f"{seed}, greedy prompt seed {token_seed} (pass --seed {seed} to reproduce)")
            for found in (_fp32_agreement(cfg, device, gen, token_seed, with_fp64=cfg == SMALL),
                          _agreement_vs_reference(cfg, torch.bfloat16, device, gen, torch.float32,
                                                  tag={SMALL: "small", LLAMA_SMALL: "llama_small"}.get(cfg, "course"))):
                checks += found[0]
                metrics.update(found[1])
        return checks, metrics

    return _guard("correctness", body)


def small_group(args=None):
    """Tiny models, every dtype, graph on and off, against float64; no timing (for
    compute-sanitizer: every kernel launch of a whole generation, in seconds)."""
    device = pick_device(getattr(args, "device", None))
    if (fail := _needs_gpu("small", device)) is not None:
        return fail
    gen, seed = fresh_generator(getattr(args, "seed", None), device)
    print(f"[task6] small: {len(TINY)} tiny models x {sorted(DTYPES)}; inputs seed {seed}")
    graphs = (False,) if getattr(args, "no_graph", False) else (True, False)

    def body():
        checks = []
        for cfg in TINY:
            for dtype in DTYPES.values():
                found, _ = _agreement_vs_reference(cfg, dtype, device, gen, torch.float64,
                                                   tag=f"d{cfg.hidden // cfg.heads}_b{cfg.batch}_p{cfg.prompt}",
                                                   graphs=graphs)
                checks += found
        return checks, {}

    return _guard("small", body)


# --- bad input --------------------------------------------------------------------------------

def input_checks(device, backend: str) -> list[Check]:
    """Every misuse raises ValueError/TypeError with a sentence, before any kernel runs.

    Runs on a GPU with our kernels (the inputs group) and on the CPU with the torch path
    (tests/test_task6.py); the checks are the model's, the same on both."""
    cfg = TINY[0]
    model = cfg.build(torch.float32, device, attention=backend)
    gen = torch.Generator(device=device)
    gen.manual_seed(0)
    good = torch.randint(0, cfg.vocab, (2, 5), generator=gen, device=device)
    cache = model.allocate_kv_cache(2, 8)
    other = "cpu" if device.type == "cuda" else "meta"
    pos64 = torch.tensor(5, device=device)
    pos32 = torch.tensor(0, dtype=torch.int32, device=device)
    cases = [
        ("tokens on another device", lambda: model(good.to(other)), (ValueError,), "device"),
        ("float tokens", lambda: model(good.float()), (TypeError,), "dtype"),
        ("tokens of rank 1", lambda: model(good[0]), (ValueError,), "shape"),
        ("tokens of rank 3", lambda: model(good[None]), (ValueError,), "shape"),
        ("empty tokens [B, 0]", lambda: model(good[:, :0]), (ValueError,), "empty"),
        ("token id >= vocab", lambda: model(good + cfg.vocab), (ValueError,), "vocab"),
        ("negative token id", lambda: model(good - cfg.vocab), (ValueError,), "vocab"),
        ("prompt longer than the cache", lambda: model(good.repeat(1, 2), cache), (ValueError,), "cache"),
        ("prefill at current_pos 3", lambda: model(good, cache, 3), (ValueError,), "position 0"),
        ("decode past the end of the cache", lambda: model(good[:, :1], cache, 8), (ValueError,), "cache"),
        ("decode at a negative position", lambda: model(good[:, :1], cache, -1), (ValueError,), "positions"),
        ("current_pos a float", lambda: model(good[:, :1], cache, 2.0), (TypeError,), "int"),
        ("current_pos an int64 tensor", lambda: model(good[:, :1], cache, pos64), (TypeError,), "int32"),
        ("current_pos a tensor for a prefill", lambda: model(good, cache, pos32), (ValueError,), "decode"),
        ("cache with a layer missing", lambda: model(good, cache[:-1]), (ValueError,), "layer"),
        ("cache of another batch size", lambda: model(good[:1], cache), (ValueError,), "batch"),
        ("cache of another dtype", lambda: model(good, [(k.double(), v.double()) for k, v in cache]),
         (TypeError,), "dtype"),
        ("cache layers of unequal length",
         lambda: model(good, cache[:1] + [tuple(t[:, :7] for t in cache[1])]), (ValueError,), "length"),
        ("head_dim 264 > 256 with our kernels",
         lambda: customModel(528, 2, 1, 97, attention="custom", device=device), (ValueError,), "head_dim"),
        ("head_dim 12, not a multiple of 8, with our kernels",
         lambda: customModel(36, 3, 1, 97, attention="custom", device=device), (ValueError,), "multiple"),
        ("odd head_dim", lambda: customModel(30, 2, 1, 97, attention="torch", device=device),
         (ValueError,), "even"),
        ("hidden not divisible by heads", lambda: customModel(30, 4, 1, 97, device=device),
         (ValueError,), "divisible"),
        ("unknown attention backend", lambda: customModel(32, 4, 1, 97, attention="flash", device=device),
         (ValueError,), "attention"),
        ("our kernels on a CPU model",
         lambda: customModel(32, 4, 1, 97, attention="custom", device="cpu")(good.cpu()),
         (ValueError,), "CUDA"),
        ("generate 0 tokens", lambda: generate(model, good, 0), (ValueError,), "max_new_tokens"),
        ("generate past max_seq_len", lambda: generate(model, good, model.max_seq_len),
         (ValueError,), "max_seq_len"),
        ("generate into a short cache", lambda: generate(model, good, 5, kv_cache=cache),
         (ValueError,), "cache"),
    ]
    checks = [check_raises(f"{backend}: {name} raises", fn, exc, must_mention=word)
              for name, fn, exc, word in cases]
    # Supported input that is not contiguous: a strided view of token ids.
    wide = torch.randint(0, cfg.vocab, (2, 10), generator=gen, device=device)
    same = torch.equal(model(wide[:, ::2])[0], model(wide[:, ::2].contiguous())[0])
    checks.append(Check(f"{backend}: non-contiguous tokens give the same logits", same))
    return checks


def inputs_group(args=None):
    device = pick_device(getattr(args, "device", None))
    if (fail := _needs_gpu("inputs", device)) is not None:
        return fail
    return _guard("inputs", lambda: (input_checks(device, "custom"), {}))


# --- the course configuration: TTFT and TBT beside their limits ------------------------------

def decode_weight_bytes(model: customModel) -> int:
    """Weight bytes one decode step reads: every parameter except the embedding table (a
    step reads B of its rows)."""
    return sum(p.numel() * p.element_size() for n, p in model.named_parameters()
               if not n.startswith("embed."))


def decode_kv_bytes(cfg: Config, element_size: int) -> float:
    """Mean KV-cache bytes a decode step reads: the step feeding position P + i - 1 reads K and
    V of P + i tokens in every layer, i = 1 .. new - 1 (mean P + new / 2), each token's K and V
    being kv_heads x head_dim wide (hidden without grouped-query attention)."""
    mean_len = cfg.prompt + cfg.new_tokens / 2
    kv_width = cfg.hidden * (cfg.kv_heads or cfg.heads) // cfg.heads
    return 2.0 * cfg.layers * cfg.batch * mean_len * kv_width * element_size


def prefill_flops(model: customModel, batch: int, prompt: int) -> float:
    """FLOPs of the prefill as generate runs it: 2 per weight per token in every layer's
    projections and MLP, 2 per lm_head weight for the last position only, causal attention."""
    layer_weights = sum(p.numel() for p in model.layers.parameters() if p.dim() == 2)
    return (2.0 * layer_weights * batch * prompt + 2.0 * model.lm_head.weight.numel() * batch
            + model.num_layers * attention_flops(batch, model.num_heads, prompt, prompt,
                                                 model.head_dim, causal=True))


# Which kernels count as which kind in the decode profile (first match wins; demangled names).
# decode_linear_kernel<T, M, kGated, kSplits>: the SwiGLU kernel has kGated true.
PROFILE_MATCH = (("swiglu", ("decode_linear_kernel<",), ", true, "),
                 ("linear", ("decode_linear_kernel<",), ""),
                 ("attention", ("decode_split_kernel", "combine_splits_kernel", "decode_grouped_kernel",
                                "decode_gqa_kernel",
                                "merge_splits_kernel", "flash_attention"), ""),
                 ("norm", ("norm_kernel",), ""),
                 ("rope_append", ("rope_append_kernel",), ""))


def profile_kind(kernel: str) -> str:
    for kind, names, also in PROFILE_MATCH:
        if any(n in kernel for n in names) and also in kernel:
            return kind
    return "other"


@torch.no_grad()
def decode_profile(model: customModel, prompt: torch.Tensor, steps: int = PROFILE_STEPS) -> dict:
    """GPU time of one decode step by kind of kernel (PROFILE_KINDS): {kind: {us_per_step,
    kernels_per_step}}. Eager steps with the position as a device tensor, as the graph runs
    them (a kernel takes the same GPU time in a graph; only the launch gaps differ)."""
    from torch.profiler import ProfilerActivity, profile

    batch, prompt_len = prompt.shape
    cache = model.allocate_kv_cache(batch, prompt_len + steps + 2)
    logits, _ = model(prompt, cache, 0, last_logits_only=True)
    token = logits[:, -1].argmax(-1, keepdim=True)
    position = torch.tensor(prompt_len, dtype=torch.int32, device=prompt.device)

    def step():
        out, _ = model(token, cache, position, last_logits_only=True)
        token.copy_(out[:, -1].argmax(-1, keepdim=True))
        position.add_(1)

    step()   # warm-up
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(steps):
            step()
        torch.cuda.synchronize()
    found = {kind: {"us_per_step": 0.0, "kernels_per_step": 0.0} for kind, _ in PROFILE_KINDS}
    for event in prof.key_averages():
        us = getattr(event, "self_device_time_total", None)
        us = event.self_cuda_time_total if us is None else us
        if not us:
            continue
        for kind in (profile_kind(event.key), "total"):
            found[kind]["us_per_step"] += us / steps
            found[kind]["kernels_per_step"] += event.count / steps
    return found


def format_profile(dtype: str, profile: dict) -> str:
    lines = [f"[task6] {dtype}: one decode step by kind of kernel (fused decode, torch.profiler)"]
    for kind, label in PROFILE_KINDS:
        f = profile[kind]
        lines.append(f"    {label:48s} {f['us_per_step']:9.1f} us  {f['kernels_per_step']:6.1f} kernels")
    return "\n".join(lines)


@torch.no_grad()
def prefill_medians_ms(model: customModel, prompt: torch.Tensor, backends=("custom", "torch"),
                       rounds: int = TTFT_ROUNDS) -> dict[str, float]:
    """TTFT of each attention backend: one prefill of `prompt` (as generate() runs it), timed
    with CUDA events, the median of `rounds` interleaved rounds. A single prefill per backend,
    one after the other, measured the GPU's clock drift as much as the backends (the bf16
    speedup over the PyTorch path landed on either side of 1.0 in runs of the same code)."""
    before = model.attention_backend
    caches = {}
    for backend in backends:   # each backend's own cache (the torch path's is zeroed)
        model.attention_backend = backend
        caches[backend] = model.allocate_kv_cache(prompt.shape[0], prompt.shape[1])

    def timer(backend: str):
        def run(repeats: int) -> float:
            model.attention_backend = backend
            return time_cuda(lambda: model(prompt, caches[backend], 0, last_logits_only=True),
                             warmup=0, repeats=repeats).median_ms
        return run

    for backend in backends:   # warm-up: kernels loaded, cuBLAS heuristics chosen
        timer(backend)(1)
    medians = interleaved_medians({b: timer(b) for b in backends}, rounds=rounds, repeats=1)
    model.attention_backend = before
    return medians


def _course_one(cfg: Config, name: str, device, gen,
                config_name: str | None = None) -> tuple[list[Check], dict]:
    """TTFT, TBT and their rooflines of `cfg` in dtype `name`, recorded as task6.<name>.* for the
    course model, task6.<config_name or cfg.label>.<name>.* for another; the TBT target is
    checked for the course model and for a named configuration."""
    dtype = DTYPES[name]
    config = config_name if config_name is not None else ("" if cfg == COURSE else cfg.label)
    model = cfg.build(dtype, device)
    prompt = cfg.prompt_tokens(gen, device)

    # The two limits, measured in this run, on this GPU.
    copy_gbps = measure_copy_bandwidth()
    matmul_tflops = measure_matmul_tflops(dtype)
    weight_bytes = decode_weight_bytes(model)
    weight_read_ms = weight_bytes / (copy_gbps * 1e9) * 1e3
    bytes_read_ms = (weight_bytes + decode_kv_bytes(cfg, model.dtype.itemsize)) / (copy_gbps * 1e9) * 1e3
    prefill_roofline_ms = prefill_flops(model, cfg.batch, cfg.prompt) / (matmul_tflops * 1e12) * 1e3

    def run(model: customModel, backend: str, graph: bool, warmup: bool):
        model.attention_backend = backend
        if warmup:   # kernels loaded, cuBLAS heuristics chosen, allocator grown: outside the timing
            generate(model, prompt, min(4, cfg.new_tokens), use_cuda_graph=graph)
        timings: dict = {}
        tokens = generate(model, prompt, cfg.new_tokens, use_cuda_graph=graph, timings=timings,
                          progress=True)
        return tokens, timings

    ours_tokens, ours = run(model, "custom", graph=True, warmup=True)
    _, ours_eager = run(model, "custom", graph=False, warmup=True)
    with fused_kernels(model, False):   # the course's path, for comparison
        _, unfused = run(model, "custom", graph=True, warmup=True)
    profile = decode_profile(model, prompt)
    torch_tokens, torch_eager = run(model, "torch", graph=False, warmup=True)
    try:   # an extra peer (the issue compares with the eager PyTorch path): never fatal
        _, torch_graph = run(model, "torch", graph=True, warmup=False)
    except RuntimeError as err:
        print(f"[task6] note: the PyTorch path could not be captured in a CUDA graph ({err}); "
              "its graph TBT is not reported.")
        torch_graph = None
    model.attention_backend = "custom"
    split = first_divergence(ours_tokens, torch_tokens)
    ttft = prefill_medians_ms(model, prompt)
    ours["ttft_ms"], torch_eager["ttft_ms"] = ttft["custom"], ttft["torch"]

    m = {
        TTFT_MS: ours["ttft_ms"], TBT_MS: ours["tbt_ms"],
        TBT_OVER_ROOFLINE: ours["tbt_ms"] / weight_read_ms,
        "weight_read_ms": weight_read_ms, "copy_gbps": copy_gbps,
        "decode_bytes_roofline_ms": bytes_read_ms,
        TBT_OVER_BYTES: ours["tbt_ms"] / bytes_read_ms,
        UNFUSED_TBT_MS: unfused["tbt_ms"], "unfused.tbt_over_bytes_roofline": unfused["tbt_ms"] / bytes_read_ms,
        "matmul_tflops": matmul_tflops, "prefill_roofline_ms": prefill_roofline_ms,
        "ttft_over_roofline": ours["ttft_ms"] / prefill_roofline_ms,
        "eager.tbt_ms": ours_eager["tbt_ms"],
        "torch_path.ttft_ms": torch_eager["ttft_ms"], "torch_path.tbt_ms": torch_eager["tbt_ms"],
        "speedup_vs_torch_path.ttft": torch_eager["ttft_ms"] / ours["ttft_ms"],
        "speedup_vs_torch_path.tbt": torch_eager["tbt_ms"] / ours["tbt_ms"],
        "graph_speedup.tbt": ours_eager["tbt_ms"] / ours["tbt_ms"],
        "weights_gb": weight_bytes / 1e9,
    }
    if torch_graph is not None:
        m["torch_path_graph.tbt_ms"] = torch_graph["tbt_ms"]
        m["speedup_vs_torch_path_graph.tbt"] = torch_graph["tbt_ms"] / ours["tbt_ms"]
    metrics = {course_metric(name, k, config): v for k, v in m.items()}
    if not config:
        metrics.update({profile_metric(name, kind, field): v
                        for kind, fields in profile.items() for field, v in fields.items()})
    print(format_profile(name, profile))
    print(f"[task6] {name}: TTFT {m[TTFT_MS]:.1f} ms (prefill FLOPs at {matmul_tflops:.1f} TFLOP/s: "
          f"{prefill_roofline_ms:.1f} ms, {m['ttft_over_roofline']:.2f}x)\n"
          f"[task6] {name}: TBT {m[TBT_MS]:.3f} ms (weights {weight_bytes / 1e9:.2f} GB at "
          f"{copy_gbps:.0f} GB/s: {weight_read_ms:.3f} ms, {m[TBT_OVER_ROOFLINE]:.2f}x; with the KV "
          f"cache {bytes_read_ms:.3f} ms, {m[TBT_OVER_BYTES]:.2f}x; unfused {m[UNFUSED_TBT_MS]:.3f} ms); eager "
          f"{m['eager.tbt_ms']:.3f} ms\n"
          f"[task6] {name}: torch path TTFT {m['torch_path.ttft_ms']:.1f} ms, TBT "
          f"{m['torch_path.tbt_ms']:.3f} ms eager / {m.get('torch_path_graph.tbt_ms', float('nan')):.3f} ms graph; "
          f"speedup {m['speedup_vs_torch_path.ttft']:.2f}x TTFT, {m['speedup_vs_torch_path.tbt']:.2f}x TBT")
    checks = [Check(
        f"{name} generation ({cfg.describe()})", True,
        f"TTFT {m[TTFT_MS]:.1f} ms, TBT {m[TBT_MS]:.3f} ms; tokens vs torch path: "
        + ("identical" if split is None else f"first differ at step {split} (near-ties flip in "
           f"{name}; correctness is checked by --correctness)"))]
    if cfg == COURSE or config_name is not None:
        checks.append(Check(
            f"{config + ' ' if config else ''}{name} target: TBT <= {TARGET_TBT_OVER_BYTES} x "
            "(weights + KV cache) read time",
            m[TBT_OVER_BYTES] <= TARGET_TBT_OVER_BYTES,
            f"{m[TBT_MS]:.3f} ms / {bytes_read_ms:.3f} ms = {m[TBT_OVER_BYTES]:.2f}x", target=True))
    if cfg == COURSE:
        checks.append(Check(
            f"{name} acceptance: TBT <= {ACCEPT_TBT_OVER_ROOFLINE} x weight-read time",
            m[TBT_OVER_ROOFLINE] <= ACCEPT_TBT_OVER_ROOFLINE,
            f"{m[TBT_MS]:.3f} ms / {weight_read_ms:.3f} ms = {m[TBT_OVER_ROOFLINE]:.2f}x",
            target=True))
    del model
    free_gpu_memory()
    return checks, metrics


def course_group(args=None):
    """The course configuration (or the one given by flags), each dtype in --dtype."""
    device = pick_device(getattr(args, "device", None))
    if (fail := _needs_gpu("course", device)) is not None:
        return fail
    cfg = _course_config(args)
    gen, seed = fresh_generator(getattr(args, "seed", None), device)
    print(f"[task6] course: {cfg.describe()}; weights seed {WEIGHT_SEED}, prompt seed {seed}")

    def body():
        checks, metrics = [], {}
        for name in _dtypes(args):
            found, m = _course_one(cfg, name, device, gen)
            checks += found
            metrics.update(m)
        return checks, metrics

    return _guard("course", body)


def gqa_course_group(args=None):
    """Issue 32's grouped-query model (GQA_COURSE: the course size, 8 KV heads), bf16: TTFT,
    TBT and TBT against the time to read the weights and the KV cache once
    (task6.gqa.bf16.tbt_over_bytes_roofline, target TARGET_TBT_OVER_BYTES)."""
    device = pick_device(getattr(args, "device", None))
    if (fail := _needs_gpu("gqa-course", device)) is not None:
        return fail
    gen, seed = fresh_generator(getattr(args, "seed", None), device)
    print(f"[task6] gqa-course: {GQA_COURSE.describe()}, bf16; weights seed {WEIGHT_SEED}, "
          f"prompt seed {seed}")
    return _guard("gqa-course", lambda: _course_one(GQA_COURSE, "bf16", device, gen,
                                                    config_name=GQA_CONFIG))


def extra_args(parser) -> None:
    parser.add_argument("--dtype", default="fp32,bf16",
                        help="course group: comma-separated dtypes among fp32, bf16, fp16 "
                             "(default fp32,bf16; fp16/bf16 run the tensor-core kernels)")
    for flag, default, what in (("--hidden", COURSE.hidden, "hidden size"),
                                ("--heads", COURSE.heads, "attention heads"),
                                ("--layers", COURSE.layers, "decoder layers"),
                                ("--vocab", COURSE.vocab, "vocabulary size"),
                                ("--batch", COURSE.batch, "sequences"),
                                ("--prompt", COURSE.prompt, "prompt tokens"),
                                ("--new-tokens", COURSE.new_tokens, "greedy tokens to generate")):
        parser.add_argument(flag, type=int, default=None, help=f"course group: {what} (default {default})")
    parser.add_argument("--no-graph", action="store_true",
                        help="small group: eager decode only (for a tool that cannot follow CUDA graphs)")
    parser.add_argument("--course-correctness", action="store_true",
                        help="correctness group: also check at the course size (26 GB of fp32 weights)")


GROUPS = {"inputs": inputs_group, "small": small_group, "correctness": correctness_group,
          "course": course_group, "gqa-course": gqa_course_group}


def main(argv=None) -> int:
    return task_main("task6", GROUPS, argv, description=__doc__, extra_args=extra_args,
                     gpu_only=True)


if __name__ == "__main__":
    sys.exit(main())
