"""Task 7 test: GPT-2 on our kernels gives Hugging Face's tokens, and masks are never dropped.

    python -m task7.test                 # every group
    python -m task7.test --small         # tiny shapes, every dtype and mask form (sanitizer run)
    python -m task7.test --inputs        # bad options and inputs raise one clear sentence
    python -m task7.test --parity        # task7.compare: greedy 50 tokens, random-weight GPT-2
                                         # (and gpt2 when it loads); records the parity metrics

On a GPU the kernels run (task 4 and task 5 extensions, built on first use). On a CPU the
same checks run with the PyTorch versions of the operations (task5/ops.py): that tests the
loop, the cache indexing and the mask plans, not the kernels.
"""

from __future__ import annotations

if not __package__:  # run as a file, where `common` cannot be imported
    raise SystemExit("Run this from the repository root as a module: python -m task7.test")

import argparse
import contextlib
import io
import math
import os
import sys
import tempfile
from types import SimpleNamespace

import torch

from common.build import BuildError
from common.checks import Check, check_raises, check_relative, random_qkv, reference_attention
from common.harness import fresh_generator, pick_device, task_main
from task7 import compare, gpt2
from task7.hf_attention import course_attention_forward, plan_attention
from task7.inference import KernelGPT2, generate
from task7.inference_ref import hf_generate
from task5.ops import ops_for

# A GPT-2 small enough for a sanitizer run: 2 layers, 2 heads of 64 (GPT-2's head size),
# 128 positions.
TINY = dict(n_layer=2, n_embd=128, n_head=2, vocab_size=512, n_positions=128,
            bos_token_id=0, eos_token_id=1)
TINY_TOKENS = 12


def tiny_config():
    from transformers import GPT2Config

    return GPT2Config(**TINY)


DTYPES = (torch.float32, torch.float16, torch.bfloat16)


def _hf_layout(t: torch.Tensor) -> torch.Tensor:
    """Same values, laid out as transformers passes them: [B, S, H, D] memory, a [B, H, S, D] view."""
    return t.transpose(1, 2).contiguous().transpose(1, 2)


def _bool_to_float(keep: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """The 4.48-style additive mask: 0 where kept, the dtype's minimum where masked."""
    zero = torch.zeros((), dtype=dtype, device=keep.device)
    return torch.where(keep, zero, torch.finfo(dtype).min)


# --- group: small ---------------------------------------------------------------------------------

def _attention_cases(device, dtype, gen, head_dim: int):
    """(name, q, k, v, mask, scaling, expected plan kind, float64 reference, rows to compare)."""
    batch, heads, seq, cache = 2, 2, 19, 23
    q, k, v = (_hf_layout(t) for t in random_qkv(batch, heads, seq, head_dim, dtype=dtype,
                                                  device=device, generator=gen))
    q1, kc, vc = (_hf_layout(t) for t in random_qkv(batch, heads, 1, head_dim, dtype=dtype,
                                                     device=device, seq_k=cache, generator=gen))
    causal = reference_attention(q, k, v, causal=True)
    tril = torch.ones(seq, seq, dtype=torch.bool, device=device).tril().expand(batch, 1, seq, seq)
    cases = [
        ("prefill, no mask", q, k, v, None, None, "structured", causal),
        ("prefill, bool causal mask", q, k, v, tril, None, "structured", causal),
        ("prefill, float causal mask", q, k, v, _bool_to_float(tril, dtype), None, "structured",
         causal),
        ("prefill, mask longer than the keys", q, k, v,
         torch.cat([tril, torch.zeros(batch, 1, seq, 4, dtype=torch.bool, device=device)], -1),
         None, "structured", causal),
        ("prefill, scaling 0.5/sqrt(D)", q, k, v, None, 0.5 / math.sqrt(head_dim), "structured",
         reference_attention(q, k, v, causal=True, scale=0.5 / math.sqrt(head_dim))),
    ]
    # An empty static cache: keys past the queries are junk that the causal path must cut.
    k_long, v_long = (torch.cat([t, torch.randn_like(t[:, :, :8]) * 1e3], dim=2) for t in (k, v))
    cases.append(("prefill, static cache tail (no mask)", q, k_long, v_long, None, None, "structured",
                  causal))

    # Left padding: sequence 1 starts 5 tokens late; only its real rows are compared.
    pads = [0, 5]
    keep = tril.clone()
    for b, p in enumerate(pads):
        keep[b, :, :, :p] = False
    pad_ref = [reference_attention(q[b:b + 1, :, p:], k[b:b + 1, :, p:], v[b:b + 1, :, p:], causal=True)
               for b, p in enumerate(pads)]
    cases.append(("prefill, left padding", q, k, v, keep, None, "structured", (pad_ref, pads)))

    full = reference_attention(q1, kc, vc)
    lengths = [cache, 11]
    prefix = torch.stack([torch.arange(cache, device=device) < n for n in lengths])[:, None, None, :]
    prefix_ref = ([reference_attention(q1[b:b + 1], kc[b:b + 1, :, :n], vc[b:b + 1, :, :n])
                   for b, n in enumerate(lengths)], [0, 0])
    left = torch.stack([torch.arange(cache, device=device) >= p for p in (0, 7)])[:, None, None, :]
    left_ref = ([reference_attention(q1[b:b + 1], kc[b:b + 1, :, p:], vc[b:b + 1, :, p:])
                 for b, p in enumerate((0, 7))], [0, 0])
    cases += [
        ("decode, no mask", q1, kc, vc, None, None, "structured", full),
        ("decode, all-true mask", q1, kc, vc, torch.ones_like(prefix), None, "structured", full),
        ("decode, prefix mask (static cache)", q1, kc, vc, prefix, None, "structured", prefix_ref),
        ("decode, float prefix mask", q1, kc, vc, _bool_to_float(prefix, dtype), None,
         "structured", prefix_ref),
        ("decode, left padding", q1, kc, vc, left, None, "structured", left_ref),
    ]
    return cases


def _compare(name, out, ref, dtype) -> Check:
    """out [B, Sq, H, D] from the attention function against the float64 reference."""
    out = out.transpose(1, 2)   # -> [B, H, Sq, D]
    if isinstance(ref, tuple):  # per-sequence references on the real rows only
        refs, starts = ref
        pieces = [out[b:b + 1, :, s:] for b, s in enumerate(starts)]
        flat_out = torch.cat([p.reshape(-1) for p in pieces])
        flat_ref = torch.cat([r.reshape(-1) for r in refs])
        return check_relative(name, flat_out, flat_ref, dtype)
    return check_relative(name, out, ref, dtype)


def attention_checks(device, gen) -> list[Check]:
    """The registered attention function on every mask form and dtype, against float64."""
    checks = []
    module = SimpleNamespace(is_causal=True, training=False)
    for dtype in DTYPES:
        for head_dim in (64, 32):
            for name, q, k, v, mask, scaling, kind, ref in _attention_cases(device, dtype, gen, head_dim):
                label = f"attention {str(dtype).split('.')[-1]} D={head_dim}: {name}"
                plan = plan_attention(q, k, mask, True)
                if plan.kind != kind:
                    checks.append(Check(label, False, f"ran as {plan.kind!r} ({plan.reason}), "
                                                      f"expected {kind!r}"))
                    continue
                try:
                    first, _ = course_attention_forward(module, q, k, v, mask, scaling=scaling)
                    second, _ = course_attention_forward(module, q, k, v, mask, scaling=scaling)
                except BuildError:
                    raise   # task_main reports it once for the group
                except (ValueError, TypeError, RuntimeError) as err:
                    checks.append(Check(label, False, f"raised {type(err).__name__}: "
                                                      f"{str(err).splitlines()[0][:100]}"))
                    continue
                if not torch.equal(first, second):
                    checks.append(Check(label, False, "two runs on the same input differ (a race?)"))
                    continue
                check = _compare(label, first, ref, dtype)
                check.detail += f"; {plan.kind}: {plan.reason}"
                checks.append(check)
    # A real additive bias (not a keep/drop mask) reaches the kernels as the mask tensor itself.
    q, k, _ = random_qkv(1, 2, 5, 64, device=device, generator=gen)
    bias = torch.randn(1, 1, 5, 5, device=device, generator=gen)
    plan = plan_attention(q, k, bias, True)
    checks.append(Check("attention: an additive float bias runs as the kernels' float mask",
                        plan.kind == "mask" and plan.mask is not None
                        and plan.mask.is_floating_point(), f"planned {plan.describe()}"))
    return checks


def loop_checks(device) -> tuple[list[Check], dict]:
    """A tiny GPT-2: our loop and the registered attention vs stock generate, then fp16/bf16 runs."""
    model = gpt2.build_random_gpt2(0, tiny_config()).to(device)
    gen = torch.Generator().manual_seed(7)
    input_ids = torch.randint(0, TINY["vocab_size"], (1, 17), generator=gen).to(device)
    checks, _ = compare.parity_checks(model, input_ids, key="tiny", max_new_tokens=TINY_TOKENS)
    for dtype in (torch.float16, torch.bfloat16):
        name = f"tiny GPT-2 loop in {str(dtype).split('.')[-1]}"
        half = gpt2.build_random_gpt2(0, tiny_config()).to(device=device, dtype=dtype)
        runner = KernelGPT2(half, ops_for(device), input_ids.shape[1] + TINY_TOKENS)
        try:
            runner.capture_decode_graph()
            ours = generate(runner, input_ids, TINY_TOKENS, greedy=True)
        except NotImplementedError as err:
            checks.append(Check(name, False, f"not implemented: {err}"))
            continue
        ref, _, _ = hf_generate(half, input_ids, TINY_TOKENS, greedy=True)
        same = int((ours.ids.cpu() == ref.cpu()).sum())
        finite = bool(torch.isfinite(ours.first_logits).all())
        checks.append(Check(name, finite, f"finite logits: {finite}; {same}/{TINY_TOKENS} tokens "
                                          f"equal stock generate (informative at this precision); "
                                          f"CUDA graph: {runner.graph_note}"))
    return checks, {}


def small_group(args=None):
    device = pick_device(getattr(args, "device", None))
    gen, seed = fresh_generator(getattr(args, "seed", None), device)
    print(f"[task7] small: inputs seed {seed} (pass --seed {seed} to reproduce), device {device}")
    checks = attention_checks(device, gen)
    more, _ = loop_checks(device)
    return checks + more, {}


# --- group: inputs --------------------------------------------------------------------------------

@contextlib.contextmanager
def offline_env():
    """HF_HUB_OFFLINE=1 for the block: the hub counts as unreachable."""
    saved = os.environ.get("HF_HUB_OFFLINE")
    os.environ["HF_HUB_OFFLINE"] = "1"
    try:
        yield
    finally:
        if saved is None:
            os.environ.pop("HF_HUB_OFFLINE", None)
        else:
            os.environ["HF_HUB_OFFLINE"] = saved


def run_cli(main, argv) -> tuple[int, str]:
    """Run a task7 program's main(argv); (exit code, what it printed)."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
        try:
            code = main(argv)
        except SystemExit as exit_:   # argparse errors
            code = exit_.code
    return code, out.getvalue()


def inputs_group(args=None):
    device = pick_device(getattr(args, "device", None))
    checks = []
    parser = gpt2.add_common_args(argparse.ArgumentParser())

    def options(*argv):
        return parser.parse_args(list(argv))

    checks.append(check_raises("prompt + new tokens > 1024 positions is refused",
                               lambda: gpt2.check_length(1000, 50, 1024), (gpt2.PromptTooLong,),
                               must_mention="holds only 1024 positions"))
    tiny = gpt2.build_random_gpt2(0, tiny_config())
    too_long = " ".join(["5"] * 100)
    checks.append(check_raises("a prompt too long for the model is refused before generating",
                               lambda: gpt2.make_setup(options("--prompt-ids", too_long, "--device",
                                                               str(device)), tiny, "tiny", True),
                               (gpt2.PromptTooLong,), must_mention="128 positions"))
    for text, word in (("1, x", "integers"), ("", "empty"), ("3 999999", "vocabulary")):
        checks.append(check_raises(f"--prompt-ids {text!r} is refused",
                                   lambda text=text: gpt2.parse_prompt_ids(text, 512), (ValueError,),
                                   must_mention=word))
    for argv, word in ((("--max-new-tokens", "0"), "at least 1"), (("--temperature", "0"), "positive"),
                       (("--top-k", "0"), "top-k")):
        checks.append(check_raises(f"{' '.join(argv)} is refused",
                                   lambda argv=argv: gpt2.validate_args(options(*argv)), (ValueError,),
                                   must_mention=word))
    checks.append(check_raises("the kernels backend on a CPU device is refused",
                               lambda: ops_for("cpu", "kernels"), (ValueError,), must_mention="CUDA"))
    checks.append(check_raises("an unknown backend is refused", lambda: ops_for(device, "fast"),
                               (ValueError,), must_mention="backend"))
    checks.append(check_raises("a cache longer than GPT-2's positions is refused",
                               lambda: KernelGPT2(tiny, ops_for("cpu", "torch"), 129),
                               (gpt2.PromptTooLong,), must_mention="128 positions"))

    module = SimpleNamespace(is_causal=True, training=False)
    q, k, v = random_qkv(1, 2, 4, 64, device=device)
    attn_bad = [
        ("query heads not a multiple of KV heads",
         lambda: course_attention_forward(module, q, k[:, :1].expand(1, 3, 4, 64).contiguous(),
                                          v[:, :1].expand(1, 3, 4, 64).contiguous(), None),
         "multiple"),
        ("3D query", lambda: course_attention_forward(module, q[0], k, v, None), "[B, H, S, D]"),
        ("key/value shapes differ", lambda: course_attention_forward(module, q, k, v[:, :, :2], None),
         "do not match"),
        ("empty keys", lambda: course_attention_forward(module, q, k[:, :, :0], v[:, :, :0], None),
         "empty"),
    ]
    for name, fn, word in attn_bad:
        checks.append(check_raises(f"registered attention: {name} is refused", fn, (ValueError,),
                                   must_mention=word))

    with offline_env():
        checks.append(check_raises("offline, a hub model that is not cached: one sentence",
                                   lambda: gpt2.load_pretrained_gpt2("attention-kernels/no-such-gpt2"),
                                   (gpt2.ModelUnavailable,), must_mention="--random-weights"))
        from task7 import inference

        code, printed = run_cli(inference.main, ["--model", "attention-kernels/no-such-gpt2",
                                                 "--max-new-tokens", "2"])
        lines = [line for line in printed.splitlines() if line.strip()]
        ok = (code == 1 and len(lines) == 1 and "--random-weights" in printed
              and "Traceback" not in printed)
        checks.append(Check("offline CLI: exit 1 with one sentence, no traceback", ok,
                            f"exit {code}: {printed.strip()[:120]!r}"))
    with tempfile.TemporaryDirectory() as empty:
        checks.append(check_raises("an empty model folder: one sentence",
                                   lambda: gpt2.load_pretrained_gpt2(empty), (gpt2.ModelUnavailable,),
                                   must_mention="save_pretrained"))
    return checks, {}


# --- group: parity --------------------------------------------------------------------------------

def parity_group(args=None):
    device = pick_device(getattr(args, "device", None))
    seed = getattr(args, "seed", None)
    checks, metrics = compare.run(device=device, seed=gpt2.SEED if seed is None else seed)
    return checks, metrics


GROUPS = {"small": small_group, "inputs": inputs_group, "parity": parity_group}


def main(argv=None) -> int:
    return task_main("task7", GROUPS, argv, description=__doc__)


if __name__ == "__main__":
    sys.exit(main())

