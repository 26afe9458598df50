"""GPT-2, Llama, Mistral, Qwen2, Gemma-2, Gemma-3, GPT-OSS and Phi-3 from transformers on our
kernels: offline, seeded, checked.

    python -m task7.models --model all                   # every model, single + padded, CPU or GPU
    python -m task7.models --model mistral --padded      # one model, the left-padded batch only
    python -m task7.models --model all --device cuda --record   # GPU: record task7.hf.* metrics

Each model is built from a small config with seeded random weights (no hub, no network),
shaped like the real thing where it matters for attention:
    gpt2     4 heads of 64, MHA, learned positions, biases, scale 1/sqrt(D)
    llama    8 query heads / 2 KV heads (4:1 GQA, as Llama-3), head_dim 32, RoPE
    mistral  8 / 2 heads, sliding window 16 (shorter than every prompt)
    qwen2    14 query heads / 2 KV heads (7:1 GQA, as Qwen2-0.5B), q/k/v biases
    gemma2   4 / 2 heads of 256, attention logits soft-capped at 50, sliding and full layers
             alternating (window 16; the real one is 4096), query_pre_attn_scalar 224 (a
             softmax scale other than 1/sqrt(D)), final logit softcap 30
    gemma3   4 / 2 heads of 256, a sliding layer (window 20; the real ones are 512-1024) then a
             full one, query_pre_attn_scalar 192, q/k norms
    gptoss   8 / 2 heads of 64 with attention sinks (s_aux), sliding and full layers
             alternating (window 12; the real one is 128), a mixture of 4 experts
    phi3     4 heads of 96 (Phi-3-mini's head_dim), MHA, fused qkv projection
(Windows are shortened, as Mistral's, so that they cut into every prompt.)
Cases: "single" (one prompt of 48 tokens) and "padded" (3 prompts of 48, 37 and 23 tokens,
left-padded into one batch, as transformers batches generation).

For every model and case it runs stock `model.generate` (greedy) with the implementation
transformers uses for the model, "sdpa" or, where the model does not support it, "eager"
(Gemma-2: SDPA has no softcap; GPT-OSS: no sinks; REFERENCE_ATTENTION), and with
"course_kernels" (task7/hf_attention.py); "sdpa" below means that reference. It prints:
  * fallbacks   attention calls that did not run on our kernels (0 is the target), by reason;
  * tokens      fp32 greedy ids over --new-tokens (40) identical to sdpa's (1/0), and the
                largest logit difference over every step (informative);
  * chunked     the prompt fed in two chunks through the cache on our kernels (a
                continuation: Sq != Sk, bottom-right causal, the sliding window across the
                cache boundary) gives sdpa's one-pass logits of the second chunk within fp32
                rounding (max |diff| <= 1e-4 of the largest logit);
  * fp16        first-step logits in fp16 vs the fp32 truth, against sdpa's own fp16 error:
                max|ours16 - ref32| <= 2 * max|sdpa16 - ref32| + 2^-10 * max|ref32|, which is
                FlashAttention-2's test criterion lifted to the logits, plus one fp16 ulp at
                the largest logit (the logits themselves are rounded to fp16, so nothing
                smaller is measurable);
  * TBT         ms per generated token after the first (median step), ours vs stock sdpa
                generate, in --dtype (default fp16 on a GPU, fp32 on a CPU): CUDA events on a
                GPU (common.timing.TokenClock), the host clock on a CPU. These models are tiny,
                so TBT is mostly generate()'s own per-step overhead on both sides.
With --record the figures go to results/<gpu>.json (common.results.record) as
task7.hf.<model>.<case>.{fallbacks, tokens_equal, chunked_ok, fp16_logits_ok,
fp16_logits_err, tbt_ms, sdpa_tbt_ms, tbt_speedup} (task7/manifest.py names them and their
Results.md table). Exit status 0 when every check passes.
"""

from __future__ import annotations

if not __package__:  # run as a file, where `common` cannot be imported
    raise SystemExit("Run this from the repository root as a module: python -m task7.models")

import argparse
import statistics
import sys
import time
from dataclasses import dataclass, field

import torch

from task7 import hf_attention
from task7.hf_attention import NAME, set_attention, use_course_attention
from task7.inference_ref import hf_generate
from task7.manifest import HF_CASES, HF_FIELDS, HF_MODELS, hf

MODELS, CASES = HF_MODELS, HF_CASES
PROMPT_LENGTHS = {"single": (48,), "padded": (48, 37, 23)}
NEW_TOKENS = 40
VOCAB = 1024
SEED = 0
PROMPT_SEED = 1234
MISTRAL_WINDOW = 16
GEMMA2_WINDOW, GEMMA3_WINDOW, GPTOSS_WINDOW = 16, 20, 12
# The implementation each model is checked against: what transformers runs for it (Gemma-2
# and GPT-OSS do not support SDPA: softcap, sinks), "sdpa" for every other model.
REFERENCE_ATTENTION = {"gemma2": "eager", "gptoss": "eager"}
# Random weights at this scale make attention peaked (scores of a few units) and the logits'
# top-2 gaps far above fp32 rounding, so a wrong mask changes tokens and ties do not.
INIT_RANGE = 0.1
LOGIT_RTOL = 1e-4            # fp32: max |diff| relative to the largest |logit| (at least 1)
FP16_ULP = 2.0 ** -10
WARMUP_TOKENS = 3


def metric_names(model: str, case: str) -> dict[str, str]:
    """The names --record writes for one model and case (task7/manifest.py declares them)."""
    return {field: hf(model, case, field) for field in HF_FIELDS}


# --- models ------------------------------------------------------------------------------------

def model_config(name: str):
    """A small config of each family (fp32 weights, eval mode, no hub)."""
    import transformers as tf

    common = dict(vocab_size=VOCAB, bos_token_id=0, eos_token_id=1, pad_token_id=0,
                  initializer_range=INIT_RANGE)
    if name == "gpt2":
        return tf.GPT2Config(n_layer=2, n_embd=256, n_head=4, n_positions=256, **common)
    decoder = dict(hidden_size=256, intermediate_size=512, num_hidden_layers=2,
                   num_attention_heads=8, num_key_value_heads=2, head_dim=32,
                   max_position_embeddings=256, tie_word_embeddings=False, **common)
    if name == "llama":
        return tf.LlamaConfig(**decoder)
    if name == "mistral":
        return tf.MistralConfig(sliding_window=MISTRAL_WINDOW, **decoder)
    if name == "qwen2":
        decoder.update(hidden_size=448, intermediate_size=896, num_attention_heads=14,
                       num_key_value_heads=2)
        return tf.Qwen2Config(**decoder)
    alternating = ["sliding_attention", "full_attention"]
    if name == "gemma2":
        decoder.update(num_attention_heads=4, head_dim=256)
        return tf.Gemma2Config(sliding_window=GEMMA2_WINDOW, layer_types=alternating,
                               attn_logit_softcapping=50.0, final_logit_softcapping=30.0,
                               query_pre_attn_scalar=224, **decoder)
    if name == "gemma3":
        decoder.update(num_attention_heads=4, head_dim=256)
        return tf.Gemma3TextConfig(sliding_window=GEMMA3_WINDOW, layer_types=alternating,
                                   query_pre_attn_scalar=192, **decoder)
    if name == "gptoss":
        decoder.update(head_dim=64, intermediate_size=256)
        return tf.GptOssConfig(sliding_window=GPTOSS_WINDOW, layer_types=alternating,
                               num_local_experts=4, num_experts_per_tok=2, **decoder)
    if name == "phi3":
        decoder.update(hidden_size=384, intermediate_size=768, num_attention_heads=4,
                       num_key_value_heads=4)
        del decoder["head_dim"]           # Phi-3 derives it: 384 / 4 = 96
        return tf.Phi3Config(**decoder)
    raise ValueError(f"Unknown model {name!r}; choose one of {', '.join(MODELS)} or all.")


def reference_attention(name: str) -> str:
    """The attention implementation `name` is checked against ("sdpa" or "eager")."""
    return REFERENCE_ATTENTION.get(name, "sdpa")


def build_model(name: str, seed: int = SEED, device="cpu", dtype=torch.float32):
    """The model with weights drawn after torch.manual_seed(seed): same seed, same weights."""
    from transformers import AutoModelForCausalLM

    config = model_config(name)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config, attn_implementation=reference_attention(name))
    return model.to(device=device, dtype=dtype).eval()


def prompts(case: str, device, vocab: int = VOCAB) -> tuple[torch.Tensor, torch.Tensor]:
    """(input_ids [B, L], attention_mask [B, L]): fixed pseudo-random prompts, left-padded."""
    lengths = PROMPT_LENGTHS[case]
    width = max(lengths)
    gen = torch.Generator().manual_seed(PROMPT_SEED)
    ids = torch.zeros(len(lengths), width, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for row, n in enumerate(lengths):
        ids[row, width - n:] = torch.randint(2, vocab, (n,), generator=gen)   # no bos/eos ids
        mask[row, width - n:] = 1
    return ids.to(device), mask.to(device)


# --- checks ------------------------------------------------------------------------------------

@dataclass
class CaseResult:
    model: str
    case: str
    fallbacks: int = 0
    fallback_reasons: dict = field(default_factory=dict)
    routes: dict = field(default_factory=dict)
    tokens_equal: bool = False
    first_difference: str = ""
    logit_diff: float = float("nan")
    chunked_ok: bool = False
    chunked_diff: float = float("nan")
    chunked_fallbacks: int = 0
    fp16_ok: bool = False
    fp16_err: float = float("nan")
    fp16_sdpa_err: float = float("nan")
    fp16_tol: float = float("nan")
    tbt_ms: float = float("nan")
    sdpa_tbt_ms: float = float("nan")
    timing_dtype: str = ""

    @property
    def passed(self) -> bool:
        return (self.fallbacks == 0 and self.chunked_fallbacks == 0 and self.tokens_equal
                and self.chunked_ok and self.fp16_ok)

    def metrics(self) -> dict[str, float]:
        names = metric_names(self.model, self.case)
        speedup = self.sdpa_tbt_ms / self.tbt_ms if self.tbt_ms > 0 else float("nan")
        values = dict(fallbacks=self.fallbacks + self.chunked_fallbacks,
                      tokens_equal=float(self.tokens_equal), chunked_ok=float(self.chunked_ok),
                      fp16_logits_ok=(float(self.fp16_ok) if self.fp16_tol == self.fp16_tol
                                      else float("nan")),           # nan: not measured
                      fp16_logits_err=self.fp16_err,
                      tbt_ms=self.tbt_ms, sdpa_tbt_ms=self.sdpa_tbt_ms, tbt_speedup=speedup)
        return {names[k]: v for k, v in values.items()}


def _first_difference(ours: torch.Tensor, ref: torch.Tensor) -> str:
    differ = (ours != ref).any(dim=0).nonzero()
    return f"first difference at step {int(differ[0])}" if differ.numel() else ""


def _generate(model, ids, mask, tokens, attn: str, logits: bool = True):
    if attn == NAME:
        use_course_attention(model)
    else:
        set_attention(model, attn)
    return hf_generate(model, ids, tokens, greedy=True, attention_mask=mask, output_logits=logits)


def _counted(fn):
    """Run fn with the fallback counters reset: (result, fallbacks, reasons, routes)."""
    hf_attention.reset_counters()
    result = fn()
    return (result, hf_attention.fallback_total(), hf_attention.fallback_counts(),
            hf_attention.call_counts())


@torch.no_grad()
def chunked_logits_check(model, ids, mask, split: int,
                         reference: str = "sdpa") -> tuple[bool, float, int]:
    """Prompt in two chunks through a DynamicCache on our kernels vs one pass with the
    reference implementation (sdpa, or eager where the model has no sdpa).

    Returns (within fp32 rounding, max |diff| of the second chunk's logits, fallbacks)."""
    set_attention(model, reference)
    full = model(input_ids=ids, attention_mask=mask).logits[:, split:].float()
    use_course_attention(model)
    hf_attention.reset_counters()
    # The cache the model makes itself (a DynamicCache, with sliding layers where the config
    # has them; older versions return their own kind), handed back for the second chunk.
    cache = model(input_ids=ids[:, :split], attention_mask=mask[:, :split],
                  use_cache=True).past_key_values
    second = model(input_ids=ids[:, split:], attention_mask=mask, past_key_values=cache,
                   use_cache=True).logits.float()
    fallbacks = hf_attention.fallback_total()
    # Only real (non-padded) positions are compared: padded rows attend to nothing.
    real = mask[:, split:].bool()
    diff = (second - full).abs().amax(dim=-1)[real].max().item()
    tol = LOGIT_RTOL * max(1.0, full.abs().max().item())
    return diff <= tol, diff, fallbacks


def _median_tbt(timing) -> float:
    return statistics.median(timing.step_ms) if timing.step_ms else float("nan")


def run_case(name: str, case: str, *, device, new_tokens: int = NEW_TOKENS,
             timing_dtype: torch.dtype | None = None, fp16: bool = True,
             timing: bool = True, seed: int = SEED) -> CaseResult:
    result = CaseResult(name, case)
    reference = reference_attention(name)
    model = build_model(name, seed, device)
    ids, mask = prompts(case, device, model.config.vocab_size)

    # fp32 greedy: stock sdpa (or eager) vs ours
    ref_ids, ref_logits, ref_timing = _generate(model, ids, mask, new_tokens, reference)
    (ours_ids, ours_logits, ours_timing), result.fallbacks, result.fallback_reasons, result.routes = (
        _counted(lambda: _generate(model, ids, mask, new_tokens, NAME)))
    result.tokens_equal = ours_ids.shape == ref_ids.shape and torch.equal(ours_ids.cpu(),
                                                                          ref_ids.cpu())
    if not result.tokens_equal:
        result.first_difference = _first_difference(ours_ids.cpu(), ref_ids.cpu())
    result.logit_diff = max((a - b).abs().max().item()
                            for a, b in zip(ours_logits, ref_logits, strict=True))

    # continuation after a cache: split inside every prompt (and, for Mistral, past the window)
    split = ids.shape[1] - 17
    result.chunked_ok, result.chunked_diff, result.chunked_fallbacks = chunked_logits_check(
        model, ids, mask, split, reference)

    # fp16 first-step logits
    if fp16:
        ref32 = ref_logits[0]
        half = build_model(name, seed, device, torch.float16)
        _, sdpa16, _ = _generate(half, ids, mask, 1, reference)
        (res16, fb16, reasons16, _) = _counted(lambda: _generate(half, ids, mask, 1, NAME))
        result.fallbacks += fb16
        for k, v in reasons16.items():
            result.fallback_reasons[k] = result.fallback_reasons.get(k, 0) + v
        ours16 = res16[1][0]
        result.fp16_sdpa_err = (sdpa16[0] - ref32).abs().max().item()
        result.fp16_err = (ours16 - ref32).abs().max().item()
        result.fp16_tol = 2 * result.fp16_sdpa_err + FP16_ULP * ref32.abs().max().item()
        result.fp16_ok = bool(torch.isfinite(ours16).all()) and result.fp16_err <= result.fp16_tol
        del half
    else:
        result.fp16_ok = True

    if timing:
        dtype = timing_dtype or torch.float32
        result.timing_dtype = str(dtype).replace("torch.", "")
        if dtype == torch.float32:
            # The fp32 runs above were timed already (the median step is robust to warm-up).
            result.sdpa_tbt_ms, result.tbt_ms = _median_tbt(ref_timing), _median_tbt(ours_timing)
        else:
            timed = build_model(name, seed, device, dtype)
            tbt = {}
            for attn in (reference, NAME, reference, NAME):   # interleaved; the second kept
                _generate(timed, ids, mask, WARMUP_TOKENS, attn, logits=False)
                _, _, t = _generate(timed, ids, mask, new_tokens, attn, logits=False)
                tbt[attn] = _median_tbt(t)
            result.sdpa_tbt_ms, result.tbt_ms = tbt[reference], tbt[NAME]
    return result


# --- the command -------------------------------------------------------------------------------

def _line(r: CaseResult) -> str:
    fb = r.fallbacks + r.chunked_fallbacks
    reasons = f" ({', '.join(f'{k}: {v}' for k, v in r.fallback_reasons.items())})" if fb else ""
    tokens = "identical" if r.tokens_equal else f"DIFFER ({r.first_difference})"
    routes = ", ".join(f"{k} {v}" for k, v in sorted(r.routes.items()) if k != "fallback")
    parts = [f"{r.model:8s} {r.case:7s}",
             f"fallbacks {fb}{reasons} (kernel calls: {routes or 'none'})",
             f"fp32 tokens {tokens} (logits max|diff| {r.logit_diff:.1e})",
             f"chunked {'ok' if r.chunked_ok else 'FAIL'} ({r.chunked_diff:.1e})"]
    if r.fp16_tol == r.fp16_tol:
        parts.append(f"fp16 logits {'ok' if r.fp16_ok else 'FAIL'} (err {r.fp16_err:.2e}, sdpa "
                     f"{r.fp16_sdpa_err:.2e}, tol {r.fp16_tol:.2e})")
    if r.tbt_ms == r.tbt_ms:
        parts.append(f"TBT {r.timing_dtype} ours {r.tbt_ms:.2f} ms vs sdpa {r.sdpa_tbt_ms:.2f} ms")
    return " | ".join(parts)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m task7.models", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="all", choices=MODELS + ("all",))
    cases = parser.add_mutually_exclusive_group()
    cases.add_argument("--padded", action="store_true", help="the left-padded batch only")
    cases.add_argument("--single", action="store_true", help="the single prompt only")
    parser.add_argument("--dtype", choices=("auto", "fp32", "fp16", "bf16"), default="auto",
                        help="dtype of the TBT timing (auto: fp16 on a GPU, fp32 on a CPU); "
                             "tokens are always checked in fp32, logits also in fp16")
    parser.add_argument("--new-tokens", type=int, default=NEW_TOKENS)
    parser.add_argument("--device", default=None, help="cuda or cpu (default: cuda if present)")
    parser.add_argument("--seed", type=int, default=SEED, help="seed of the random weights")
    parser.add_argument("--no-fp16", action="store_true", help="skip the fp16 logits check")
    parser.add_argument("--no-timing", action="store_true", help="skip the TBT timing")
    parser.add_argument("--record", action="store_true",
                        help="record task7.hf.* metrics in results/<gpu>.json")
    return parser


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    if args.new_tokens < 1:
        print("[task7.models] --new-tokens must be at least 1")
        return 2
    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    if device.type == "cuda" and not torch.cuda.is_available():
        print("[task7.models] --device cuda, but torch sees no CUDA GPU here; use --device cpu")
        return 2
    dtypes = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}
    timing_dtype = (dtypes[args.dtype] if args.dtype != "auto"
                    else torch.float16 if device.type == "cuda" else torch.float32)
    models = MODELS if args.model == "all" else (args.model,)
    cases = ("padded",) if args.padded else ("single",) if args.single else CASES
    import transformers

    where = torch.cuda.get_device_name(device) if device.type == "cuda" else "CPU (PyTorch twin)"
    print(f"[task7.models] {where}, torch {torch.__version__}, transformers "
          f"{transformers.__version__}; greedy {args.new_tokens} tokens, attn "
          f"{NAME!r} vs 'sdpa' ('eager' for {', '.join(sorted(REFERENCE_ATTENTION))})")
    from common.build import BuildError

    if device.type == "cpu":
        # Tiny models: one thread is faster than two fighting over a busy machine's cores.
        torch.set_num_threads(1)
    results, metrics = [], {}
    started = time.perf_counter()
    for name in models:
        for case in cases:
            try:
                r = run_case(name, case, device=device, new_tokens=args.new_tokens,
                             timing_dtype=timing_dtype, fp16=not args.no_fp16,
                             timing=not args.no_timing, seed=args.seed)
            except (BuildError, NotImplementedError) as err:
                print(f"[task7.models] {type(err).__name__}: {str(err).splitlines()[0]}")
                return 1
            print(_line(r), flush=True)
            results.append(r)
            metrics.update(r.metrics())
    failed = [f"{r.model}/{r.case}" for r in results if not r.passed]
    print(f"[task7.models] {len(results) - len(failed)}/{len(results)} cases pass "
          f"({time.perf_counter() - started:.1f} s)" + (f"; failing: {', '.join(failed)}"
                                                          if failed else ""))
    if args.record:
        from common.results import record

        metrics = {k: v for k, v in metrics.items() if v == v}     # not measured: left out
        print(f"[task7.models] recorded {len(metrics)} metrics in {record(metrics)}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
