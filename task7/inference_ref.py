"""The reference: the same prompt and settings through stock Hugging Face `model.generate`.

    python -m task7.inference_ref                       # gpt2, the course prompt, sampled
    python -m task7.inference_ref --greedy --random-weights
    python -m task7.inference_ref --attn-implementation course_kernels   # stock generate on our kernels

How it is timed (the same definition as task7.inference, so the two compare): a
LogitsProcessor that does nothing but record a CUDA event is handed to `generate`. It is
called once per generated token, right after that step's forward pass has produced the
logits and before the token is chosen. TTFT = from an event recorded just before
`generate()` to the first of those events; TBT = the mean gap between consecutive ones.
Nothing is synchronised until generation is over. A short warm-up generation runs first.

Both programs generate exactly --max-new-tokens tokens: the end-of-text token does not stop
generation (it is switched off for the call), so both time the same number of steps.
"""

from __future__ import annotations

if not __package__:  # run as a file, where `common` cannot be imported
    raise SystemExit("Run this from the repository root as a module: python -m task7.inference_ref")

import argparse
import contextlib
import sys

import torch

from common.timing import TokenClock, TokenTiming
from task7.gpt2 import (
    ModelUnavailable,
    PromptTooLong,
    add_common_args,
    clock_name,
    make_setup,
    render,
    settings_line,
)

WARMUP_TOKENS = 4


@contextlib.contextmanager
def _no_eos(model):
    """Generate exactly max_new_tokens: switch the end-of-text stop off for this call.

    Passing eos_token_id=None to generate() is not enough: generate() fills unset options
    from model.generation_config, so the model's own setting is changed and restored.
    """
    config = model.generation_config
    saved = config.eos_token_id
    config.eos_token_id = None
    try:
        yield saved
    finally:
        config.eos_token_id = saved


@torch.no_grad()
def hf_generate(model, input_ids: torch.Tensor, max_new_tokens: int, *, greedy: bool,
                top_k: int = 10, temperature: float = 0.95, seed: int = 0,
                output_logits: bool = False, attention_mask: torch.Tensor | None = None):
    """Stock generate; returns (new ids [B, N], raw logits per step or None, TokenTiming)."""
    from transformers import LogitsProcessor, LogitsProcessorList

    device = input_ids.device
    clock = TokenClock(device, max_new_tokens)

    class _MarkEachToken(LogitsProcessor):
        """Records when each step's logits are ready; changes nothing."""

        def __call__(self, ids, scores):
            clock.mark()
            return scores

    if attention_mask is None:
        attention_mask = torch.ones_like(input_ids)
    options = dict(max_new_tokens=max_new_tokens, do_sample=not greedy,
                   attention_mask=attention_mask, return_dict_in_generate=True,
                   output_logits=output_logits,
                   logits_processor=LogitsProcessorList([_MarkEachToken()]))
    if not greedy:
        options.update(top_k=top_k, temperature=temperature, top_p=1.0)
    with _no_eos(model) as eos:
        options["pad_token_id"] = eos if isinstance(eos, int) else 0
        torch.manual_seed(seed)
        clock.start()
        out = model.generate(input_ids, **options)
    new_ids = out.sequences[:, input_ids.shape[1]:]
    timing = TokenTiming.from_marks(clock.times_ms())
    logits = [step.float() for step in out.logits] if output_logits else None
    return new_ids, logits, timing


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m task7.inference_ref", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    add_common_args(parser)
    parser.add_argument("--attn-implementation", default="sdpa",
                        help="transformers attention: sdpa (default), eager, or course_kernels "
                             "(our kernels through the AttentionInterface)")
    return parser


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    try:
        setup = make_setup(args)
    except ModelUnavailable as err:
        print(f"[task7.inference_ref] {err}")
        return 1
    except (PromptTooLong, ValueError) as err:
        print(f"[task7.inference_ref] {err}")
        return 2

    from task7.hf_attention import NAME, set_attention, use_course_attention

    try:
        if args.attn_implementation == NAME:
            use_course_attention(setup.model)
        else:
            set_attention(setup.model, args.attn_implementation)
    except (ValueError, RuntimeError, KeyError) as err:
        print(f"[task7.inference_ref] {str(err).splitlines()[0]}")
        return 2

    device_name = torch.cuda.get_device_name() if setup.device.type == "cuda" else "CPU"
    print(f"[task7.inference_ref] {setup.label}, {args.dtype}, {device_name}; stock "
          f"generate, attention {args.attn_implementation!r}; {settings_line(args)}")
    if setup.tokenizer is None:
        print(f"[task7.inference_ref] {setup.note}")
    kwargs = dict(greedy=args.greedy, top_k=args.top_k, temperature=args.temperature,
                  seed=args.seed)
    hf_generate(setup.model, setup.input_ids, min(WARMUP_TOKENS, args.max_new_tokens), **kwargs)
    ids, _, timing = hf_generate(setup.model, setup.input_ids, args.max_new_tokens, **kwargs)
    print(f"\n--- prompt ---\n{render(setup.tokenizer, setup.input_ids[0])}")
    print(f"--- generated ---\n{render(setup.tokenizer, ids[0])}\n")
    print(f"[task7.inference_ref] {timing.line(clock_name(setup.device))}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
