"""Parity: do our kernels change GPT-2's output? Checked, not eyeballed.

    python -m task7.compare                  # random-weight GPT-2 (offline), and gpt2 if it loads
    python -m task7.compare --no-pretrained  # random weights only

Greedy decoding, 50 new tokens, fp32, the same prompt through every path:
  (a) our loop (task7.inference: task 4 prefill, task 5 decode; eagerly, and replaying its
      CUDA graph) against stock `model.generate` (sdpa): identical token ids, and the
      first step's logits equal within fp32 rounding (max |diff| <= 1e-4 of the largest
      logit: a wrong mask or scale moves logits by far more);
  (b) stock `generate` with our kernels registered as a transformers attention
      implementation ("course_kernels") against stock generate with "sdpa" and with
      "eager": identical token ids; and a left-padded batch of two prompts through it,
      which must give sdpa's tokens and logits (the padding mask is honoured, not dropped).
Token ids can only differ where two logits are closer than the rounding noise; a failing
check names the first differing step and the reference's top-2 gap there.

Random weights: GPT2LMHeadModel(GPT2Config()) seeded, so it runs with no network.
On a machine without a GPU the same checks run with the PyTorch versions of the
operations (task5/ops.py), which tests the loop and the mask handling, not the kernels.
"""

from __future__ import annotations

if not __package__:  # run as a file, where `common` cannot be imported
    raise SystemExit("Run this from the repository root as a module: python -m task7.compare")

import argparse
import sys

import torch

from common.checks import Check, report
from task7.gpt2 import (
    DEFAULT_MODEL,
    SEED,
    ModelUnavailable,
    build_random_gpt2,
    check_length,
    fixed_prompt_ids,
    load_cached_tokenizer,
    load_pretrained_gpt2,
    resolve_device,
)
from task7.hf_attention import NAME, set_attention, use_course_attention
from task7.inference import KernelGPT2, generate
from task7.inference_ref import hf_generate
from task5.ops import ops_for
from task7.manifest import parity

PARITY_TOKENS = 50
LOGIT_RTOL = 1e-4      # max |logit diff| allowed, relative to the largest |logit| (at least 1)
PADDED_TOKENS = 8      # tokens generated for the left-padded batch check


def _first_difference(ours: torch.Tensor, ref: torch.Tensor, ref_logits) -> str:
    """Where two [B, N] id tensors first differ, and how close the reference's top two were."""
    n = min(ours.shape[1], ref.shape[1])
    differ = (ours[:, :n] != ref[:, :n]).any(dim=0).nonzero()
    if differ.numel() == 0:
        return f"lengths {ours.shape[1]} vs {ref.shape[1]}"
    step = int(differ[0])
    detail = f"first difference at step {step}"
    if ref_logits is not None and step < len(ref_logits):
        top2 = ref_logits[step][0].float().topk(2).values
        detail += f" (reference top-2 logit gap there {float(top2[0] - top2[1]):.2e})"
    return detail


def tokens_check(name: str, ours: torch.Tensor, ref: torch.Tensor, ref_logits=None) -> Check:
    ours, ref = ours.cpu(), ref.cpu()
    if ours.shape == ref.shape and torch.equal(ours, ref):
        return Check(name, True, f"{ref.shape[1]} identical token ids")
    return Check(name, False, _first_difference(ours, ref, ref_logits))


def padded_batch(input_ids: torch.Tensor, cut: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Two prompts, the second `cut` tokens shorter and left-padded, with their 2D mask."""
    prompt = input_ids[0]
    short = prompt[cut:]
    ids = torch.stack([prompt, torch.cat([torch.zeros_like(prompt[:cut]), short])])
    mask = torch.ones_like(ids)
    mask[1, :cut] = 0
    return ids, mask


def parity_checks(model, input_ids: torch.Tensor, *, key: str, backend: str = "auto",
                  max_new_tokens: int = PARITY_TOKENS, cuda_graph: bool = True,
                  padded: bool = True) -> tuple[list[Check], dict]:
    """(a) and (b) above for one model (eval, fp32, on its device); metrics under task7.parity.<key>."""
    device = input_ids.device
    prompt_len = input_ids.shape[1]
    check_length(prompt_len, max_new_tokens, model.config.n_positions)
    checks: list[Check] = []
    prefix = f"[{key}]"

    set_attention(model, "sdpa")
    ref_ids, ref_logits, _ = hf_generate(model, input_ids, max_new_tokens, greedy=True,
                                         output_logits=True)

    # (a) our loop
    loop_equal, diff, graph_used = False, float("nan"), False
    runner = KernelGPT2(model, ops_for(device, backend), prompt_len + max_new_tokens)
    try:
        ours = generate(runner, input_ids, max_new_tokens, greedy=True, use_graph=False)
        again = generate(runner, input_ids, max_new_tokens, greedy=True, use_graph=False)
    except NotImplementedError as err:
        checks.append(Check(f"{prefix} our loop", False, f"not implemented: {err}"))
    else:
        checks.append(tokens_check(f"{prefix} our loop ({runner.ops.name}) vs stock generate",
                                   ours.ids, ref_ids, ref_logits))
        loop_equal = checks[-1].passed
        repeat_ok = (torch.equal(again.ids, ours.ids)
                     and torch.equal(again.first_logits, ours.first_logits))
        checks.append(Check(f"{prefix} our loop gives the same ids and logits twice", repeat_ok,
                            "bit-for-bit" if repeat_ok else "a result changed between two runs (a race?)"))
        ref_first = ref_logits[0].to(ours.first_logits.device)
        diff = (ours.first_logits - ref_first).abs().max().item()
        tol = LOGIT_RTOL * max(1.0, ref_first.abs().max().item())
        checks.append(Check(f"{prefix} first-step logits vs stock generate", diff <= tol,
                            f"max |diff| {diff:.2e} (tol {tol:.1e})"))

        if cuda_graph and device.type == "cuda":
            graph_used = runner.capture_decode_graph()
            if graph_used:
                graphed = generate(runner, input_ids, max_new_tokens, greedy=True, use_graph=True)
                checks.append(tokens_check(f"{prefix} our loop with the CUDA graph vs stock generate",
                                           graphed.ids, ref_ids, ref_logits))
                loop_equal = loop_equal and checks[-1].passed
            else:
                # The loop then decodes eagerly, which the checks above cover; say why.
                checks.append(Check(f"{prefix} CUDA graph of the decode step", True,
                                    f"not used: {runner.graph_note}"))
    del runner

    # (b) stock generate on our kernels through the AttentionInterface
    use_course_attention(model)
    try:
        reg_ids, _, _ = hf_generate(model, input_ids, max_new_tokens, greedy=True)
        if padded:
            ids2, mask2 = padded_batch(input_ids, cut=max(1, prompt_len // 3))
            reg_pad, reg_pad_logits, _ = hf_generate(model, ids2, PADDED_TOKENS, greedy=True,
                                                     attention_mask=mask2, output_logits=True)
        set_attention(model, "eager")
        eager_ids, _, _ = hf_generate(model, input_ids, max_new_tokens, greedy=True)
        set_attention(model, "sdpa")
        if padded:
            sdpa_pad, sdpa_pad_logits, _ = hf_generate(model, ids2, PADDED_TOKENS, greedy=True,
                                                       attention_mask=mask2, output_logits=True)
    finally:
        set_attention(model, "sdpa")
    checks.append(tokens_check(f"{prefix} generate(attn={NAME!r}) vs generate(sdpa)",
                               reg_ids, ref_ids, ref_logits))
    checks.append(tokens_check(f"{prefix} generate(attn={NAME!r}) vs generate(eager)",
                               reg_ids, eager_ids))
    interface_equal = checks[-1].passed and checks[-2].passed
    if padded:
        # Random weights make attention a small term, so a dropped mask may leave the argmax
        # alone; the logits of every step show it (a dropped mask moves them by ~1e-1).
        pad_diff = max((a - b).abs().max().item() for a, b in zip(reg_pad_logits, sdpa_pad_logits,
                                                                   strict=True))
        pad_tol = LOGIT_RTOL * max(1.0, max(t.abs().max().item() for t in sdpa_pad_logits))
        same_ids = torch.equal(reg_pad.cpu(), sdpa_pad.cpu())
        checks.append(Check(f"{prefix} left-padded batch of 2: attn={NAME!r} vs sdpa "
                            "(the padding mask is honoured)", same_ids and pad_diff <= pad_tol,
                            f"{'identical' if same_ids else 'different'} token ids, logits max "
                            f"|diff| {pad_diff:.2e} over {PADDED_TOKENS} steps (tol {pad_tol:.1e})"))
        interface_equal = interface_equal and checks[-1].passed

    metrics = {
        parity(key, "tokens_equal"): 1.0 if loop_equal else 0.0,
        parity(key, "max_logit_diff"): diff,
        parity(key, "hf_interface_tokens_equal"): 1.0 if interface_equal else 0.0,
        parity(key, "cuda_graph"): 1.0 if graph_used else 0.0,
    }
    return checks, metrics


def random_weight_parity(device, *, seed: int = SEED, backend: str = "auto",
                         max_new_tokens: int = PARITY_TOKENS, config=None, cuda_graph: bool = True):
    """Parity on GPT-2 built from its config with seeded weights (no network), fp32."""
    model = build_random_gpt2(seed, config).to(device)
    tokenizer = load_cached_tokenizer(DEFAULT_MODEL)
    if tokenizer is not None:
        from task7.gpt2 import COURSE_PROMPT

        ids = tokenizer(COURSE_PROMPT)["input_ids"]
    else:
        ids = fixed_prompt_ids(model.config.vocab_size)
    input_ids = torch.tensor([ids], device=device)
    return parity_checks(model, input_ids, key="random_weights", backend=backend,
                         max_new_tokens=max_new_tokens, cuda_graph=cuda_graph)


def pretrained_parity(device, name: str = DEFAULT_MODEL, *, backend: str = "auto",
                      max_new_tokens: int = PARITY_TOKENS, cuda_graph: bool = True):
    """Parity on a pretrained GPT-2 (raises ModelUnavailable when it cannot be loaded)."""
    from task7.gpt2 import COURSE_PROMPT, load_tokenizer

    model = load_pretrained_gpt2(name).to(device)
    tokenizer = load_tokenizer(name)
    ids = (tokenizer(COURSE_PROMPT)["input_ids"] if tokenizer is not None
           else fixed_prompt_ids(model.config.vocab_size))
    input_ids = torch.tensor([ids], device=device)
    key = name.rstrip("/").split("/")[-1].replace(".", "_")
    return parity_checks(model, input_ids, key=key, backend=backend,
                         max_new_tokens=max_new_tokens, cuda_graph=cuda_graph)


def run(*, device=None, seed: int = SEED, backend: str = "auto", pretrained: str | None = DEFAULT_MODEL,
        max_new_tokens: int = PARITY_TOKENS, cuda_graph: bool = True) -> tuple[list[Check], dict]:
    """Random weights always; the pretrained model too when it loads (skipped with a line if not)."""
    device = resolve_device(device)
    checks, metrics = random_weight_parity(device, seed=seed, backend=backend,
                                           max_new_tokens=max_new_tokens, cuda_graph=cuda_graph)
    if pretrained:
        try:
            more, found = pretrained_parity(device, pretrained, backend=backend,
                                            max_new_tokens=max_new_tokens, cuda_graph=cuda_graph)
        except ModelUnavailable as err:
            print(f"[task7.compare] {pretrained!r} skipped: {err}")
        else:
            checks += more
            metrics.update(found)
    return checks, metrics


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m task7.compare", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default=DEFAULT_MODEL,
                        help="pretrained GPT-2 to check besides random weights (hub name or folder)")
    parser.add_argument("--no-pretrained", action="store_true", help="random weights only")
    parser.add_argument("--seed", type=int, default=SEED, help="seed of the random weights")
    parser.add_argument("--max-new-tokens", type=int, default=PARITY_TOKENS)
    parser.add_argument("--attention", choices=("auto", "kernels", "torch"), default="auto")
    parser.add_argument("--no-cuda-graph", action="store_true")
    parser.add_argument("--device", default=None)
    return parser


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    from common.build import BuildError

    try:
        checks, metrics = run(device=args.device, seed=args.seed, backend=args.attention,
                              pretrained=None if args.no_pretrained else args.model,
                              max_new_tokens=args.max_new_tokens,
                              cuda_graph=not args.no_cuda_graph)
    except (BuildError, ValueError) as err:
        print(f"[task7.compare] {err}")
        return 1
    for name, value in sorted(metrics.items()):
        print(f"  {name} = {value:.6g}")
    return report("task7.compare: our kernels vs Hugging Face, greedy", checks)


if __name__ == "__main__":
    sys.exit(main())
