"""What both GPT-2 programs share: options, loading (hub, folder, or offline), the prompt, timing.

`python -m task7.inference` (our kernels) and `python -m task7.inference_ref` (stock
Hugging Face `generate`) parse the same options with `add_common_args`, load the same model
with `load_setup`, and time tokens the same way with common.timing's `TokenClock`, so their
numbers compare.

Loading never hangs and never prints a traceback when there is no network:
  * `--model` takes a hub name (default `gpt2`) or a local folder (`save_pretrained` output);
    a hub name is looked up in the local cache first, and the hub is asked only when a quick
    probe says it is reachable; otherwise `ModelUnavailable` carries one sentence saying
    what to do.
  * `--random-weights` builds GPT-2 from its config (12 layers, 12 heads, hidden 768,
    1024 positions, vocabulary 50257) with weights drawn after `torch.manual_seed(seed)`:
    the same seed gives the same weights on every machine, with no network at all.
  * Without a tokenizer (offline, random weights) the programs work on token ids: the
    prompt is a fixed list of ids (or `--prompt-ids`) and the output is printed as ids.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import socket
import threading
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlparse

import torch

DEFAULT_MODEL = "gpt2"
# The course prompt, in our words: GPT-2 is asked what FlashAttention kernels gain over a
# naive PyTorch attention (shared memory, complexity, speed).
COURSE_PROMPT = ("Compared with a naive PyTorch implementation of attention, FlashAttention "
                 "kernels have three advantages: how they use shared memory, their memory "
                 "complexity, and their performance. First,")
MAX_NEW_TOKENS, TOP_K, TEMPERATURE, SEED = 50, 10, 0.95, 0
# Without a tokenizer the prompt is this many fixed pseudo-random ids (drawn with this seed,
# independent of --seed so that every run asks the same question).
PROMPT_IDS_LENGTH, PROMPT_IDS_SEED = 24, 1234
DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}

OFFLINE_SENTENCE = ("Could not load {name!r} from the Hugging Face hub (offline?); pass "
                    "--model <local folder> or --random-weights.")


class ModelUnavailable(RuntimeError):
    """The model could not be loaded; the message is one sentence saying what to do."""


class PromptTooLong(ValueError):
    """Prompt plus new tokens do not fit GPT-2's position table."""


# --- options --------------------------------------------------------------------------------

def add_common_args(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """The options inference.py and inference_ref.py share (same names, same defaults)."""
    parser.add_argument("--model", default=DEFAULT_MODEL,
                        help="hub name or local folder of a GPT-2 checkpoint (default: gpt2)")
    parser.add_argument("--random-weights", action="store_true",
                        help="build GPT-2 from its config with seeded random weights (no network)")
    parser.add_argument("--tokenizer", default=None,
                        help="tokenizer name or folder (default: the model's; with "
                             "--random-weights, gpt2's if it is in the local cache)")
    parser.add_argument("--prompt", default=COURSE_PROMPT, help="the prompt text")
    parser.add_argument("--prompt-ids", default=None,
                        help="the prompt as token ids, comma- or space-separated (no tokenizer needed)")
    parser.add_argument("--max-new-tokens", type=int, default=MAX_NEW_TOKENS,
                        help=f"tokens to generate (default {MAX_NEW_TOKENS})")
    parser.add_argument("--greedy", action="store_true",
                        help="argmax decoding (deterministic) instead of sampling")
    parser.add_argument("--top-k", type=int, default=TOP_K, help=f"sampling: top-k (default {TOP_K})")
    parser.add_argument("--temperature", type=float, default=TEMPERATURE,
                        help=f"sampling: temperature (default {TEMPERATURE})")
    parser.add_argument("--seed", type=int, default=SEED,
                        help=f"seed of the sampler and of --random-weights (default {SEED})")
    parser.add_argument("--dtype", choices=sorted(DTYPES), default="fp32",
                        help="model and kernel dtype (default fp32)")
    parser.add_argument("--device", default=None, help="cuda or cpu (default: cuda if present)")
    return parser


def validate_args(args: argparse.Namespace) -> None:
    """Option values argparse cannot check by type; raises ValueError with one sentence."""
    if args.max_new_tokens < 1:
        raise ValueError(f"--max-new-tokens must be at least 1, not {args.max_new_tokens}.")
    if not args.greedy:
        if args.top_k < 1:
            raise ValueError(f"--top-k must be at least 1, not {args.top_k}.")
        if not args.temperature > 0:
            raise ValueError(f"--temperature must be positive, not {args.temperature}; "
                             "use --greedy for argmax decoding.")


def resolve_device(requested: str | None) -> torch.device:
    if requested:
        device = torch.device(requested)
        if device.type == "cuda" and not torch.cuda.is_available():
            raise ValueError("--device cuda was given but no CUDA GPU is visible to torch.")
        return device
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


# --- loading --------------------------------------------------------------------------------

def _env_true(name: str) -> bool:
    return os.environ.get(name, "").strip().lower() in ("1", "true", "yes", "on")


def hub_reachable(timeout: float = 3.0) -> bool:
    """A quick TCP probe of the hub, so an offline machine fails in seconds, not minutes.

    huggingface_hub retries an unreachable host for about a minute before it gives up.
    HF_HUB_OFFLINE / TRANSFORMERS_OFFLINE mean offline; behind a proxy the probe cannot
    tell, so it answers True and lets the hub client try.
    """
    if _env_true("HF_HUB_OFFLINE") or _env_true("TRANSFORMERS_OFFLINE"):
        return False
    if any(os.environ.get(v) for v in ("HTTPS_PROXY", "https_proxy", "ALL_PROXY", "all_proxy")):
        return True
    url = urlparse(os.environ.get("HF_ENDPOINT", "https://huggingface.co"))
    host, port = url.hostname or "huggingface.co", url.port or (80 if url.scheme == "http" else 443)
    result = []

    def probe():
        try:
            socket.create_connection((host, port), timeout=timeout).close()
            result.append(True)
        except OSError:
            result.append(False)

    # getaddrinfo has no timeout of its own: run the probe in a thread and stop waiting.
    worker = threading.Thread(target=probe, daemon=True)
    worker.start()
    worker.join(timeout + 1.0)
    return bool(result and result[0])


@contextlib.contextmanager
def _quiet_transformers():
    """Silence transformers' own error logging while we try a source that may be missing."""
    from transformers.utils import logging as hf_logging

    level = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()
    try:
        yield
    finally:
        hf_logging.set_verbosity(level)


def _from_source(load, source: str, what: str):
    """load(source, local_files_only=...) from a folder, the cache, or the hub (if reachable)."""
    if Path(source).is_dir():
        try:
            with _quiet_transformers():
                return load(source, local_files_only=True)
        except Exception as err:  # noqa: BLE001 - any failure becomes one sentence
            raise ModelUnavailable(
                f"Could not load the {what} from the folder {source!r} "
                f"({type(err).__name__}); it should hold what save_pretrained wrote.") from None
    try:
        with _quiet_transformers():
            return load(source, local_files_only=True)
    except Exception:  # noqa: BLE001 - not in the cache: try the hub below
        pass
    if not hub_reachable():
        raise ModelUnavailable(OFFLINE_SENTENCE.format(name=source))
    try:
        with _quiet_transformers():
            return load(source)
    except Exception:  # noqa: BLE001 - network, auth, missing repo: one sentence
        raise ModelUnavailable(OFFLINE_SENTENCE.format(name=source)) from None


def build_random_gpt2(seed: int = SEED, config=None):
    """GPT2LMHeadModel from GPT2Config() (or `config`) with weights seeded by `seed`, eval mode.

    The weights are drawn on the CPU in fp32 after torch.manual_seed(seed), so the same seed
    gives the same model everywhere; move or cast it afterwards.
    """
    from transformers import GPT2Config, GPT2LMHeadModel

    config = GPT2Config() if config is None else config
    with torch.random.fork_rng(devices=[]):  # leave the caller's RNG stream as it was
        torch.manual_seed(seed)
        model = GPT2LMHeadModel(config)
    return model.eval()


def load_pretrained_gpt2(source: str):
    from transformers import GPT2LMHeadModel

    model = _from_source(GPT2LMHeadModel.from_pretrained, source, "GPT-2 model")
    if getattr(model.config, "model_type", "gpt2") != "gpt2":
        raise ModelUnavailable(f"{source!r} is a {model.config.model_type} checkpoint, not GPT-2; "
                               "task 7 runs GPT-2 only.")
    return model.eval()


def load_tokenizer(source: str | None):
    """AutoTokenizer from a folder, the cache or the hub; None if unavailable."""
    if source is None:
        return None
    from transformers import AutoTokenizer

    try:
        return _from_source(AutoTokenizer.from_pretrained, source, "tokenizer")
    except ModelUnavailable:
        return None


def load_cached_tokenizer(source: str):
    """The tokenizer only if it is already on this machine (never touches the network)."""
    from transformers import AutoTokenizer

    try:
        with _quiet_transformers():
            return AutoTokenizer.from_pretrained(source, local_files_only=True)
    except Exception:  # noqa: BLE001
        return None


# --- the prompt -----------------------------------------------------------------------------

def parse_prompt_ids(text: str, vocab_size: int) -> list[int]:
    parts = text.replace(",", " ").split()
    try:
        ids = [int(p) for p in parts]
    except ValueError:
        raise ValueError(f"--prompt-ids must be integers separated by commas or spaces, "
                         f"got {text!r}.") from None
    if not ids:
        raise ValueError("--prompt-ids is empty; give at least one token id.")
    bad = [i for i in ids if not 0 <= i < vocab_size]
    if bad:
        raise ValueError(f"--prompt-ids has ids outside the vocabulary [0, {vocab_size}): {bad[:5]}.")
    return ids


def fixed_prompt_ids(vocab_size: int, length: int = PROMPT_IDS_LENGTH) -> list[int]:
    gen = torch.Generator().manual_seed(PROMPT_IDS_SEED)
    return torch.randint(0, vocab_size, (length,), generator=gen).tolist()


def check_length(prompt_len: int, max_new_tokens: int, n_positions: int) -> None:
    """GPT-2 has a learned position table: positions past it do not exist."""
    if prompt_len < 1:
        raise PromptTooLong("The prompt is empty; give at least one token.")
    if prompt_len + max_new_tokens > n_positions:
        raise PromptTooLong(
            f"The prompt has {prompt_len} tokens and {max_new_tokens} new tokens were asked for, "
            f"but GPT-2 holds only {n_positions} positions; shorten the prompt or lower "
            "--max-new-tokens.")


# --- everything a run needs -----------------------------------------------------------------

@dataclass
class Setup:
    model: object                 # GPT2LMHeadModel, eval mode, on `device` in `dtype`
    tokenizer: object | None
    input_ids: torch.Tensor       # [1, prompt_len] int64 on `device`
    label: str                    # what was loaded, for printing and for recorded texts
    note: str                     # one line about the prompt (e.g. "token ids: no tokenizer")
    device: torch.device
    dtype: torch.dtype
    random_weights: bool


def load_model(args: argparse.Namespace):
    """(model, label, random_weights): pretrained or seeded random GPT-2, on the CPU in fp32."""
    if args.random_weights:
        return build_random_gpt2(args.seed), f"random-weight GPT-2 (seed {args.seed})", True
    return load_pretrained_gpt2(args.model), args.model, False


def make_setup(args: argparse.Namespace, model=None, label: str | None = None,
               random_weights: bool | None = None) -> Setup:
    """Load (unless given) the model and the tokenizer, tokenize the prompt, check its length."""
    validate_args(args)
    device = resolve_device(args.device)
    dtype = DTYPES[args.dtype]
    if model is None:
        model, label, random_weights = load_model(args)
    model = model.to(device=device, dtype=dtype).eval()
    config = model.config

    if args.tokenizer is not None:
        tokenizer = load_tokenizer(args.tokenizer)
    elif random_weights:
        tokenizer = load_cached_tokenizer(DEFAULT_MODEL)
    else:
        tokenizer = load_tokenizer(args.model)

    if args.prompt_ids is not None:
        ids = parse_prompt_ids(args.prompt_ids, config.vocab_size)
        note = f"prompt given as {len(ids)} token ids"
    elif tokenizer is not None:
        ids = tokenizer(args.prompt)["input_ids"]
        note = f"prompt: {len(ids)} tokens"
    else:
        ids = fixed_prompt_ids(config.vocab_size)
        note = (f"no tokenizer is available (offline or random weights): working on token ids; "
                f"the prompt is {len(ids)} fixed ids (choose them with --prompt-ids)")
    check_length(len(ids), args.max_new_tokens, config.n_positions)
    input_ids = torch.tensor([ids], dtype=torch.long, device=device)
    return Setup(model, tokenizer, input_ids, label, note, device, dtype, bool(random_weights))


def render(tokenizer, ids) -> str:
    """Decoded text, or the ids themselves when there is no tokenizer."""
    ids = [int(i) for i in ids]
    if tokenizer is None:
        return "token ids: " + " ".join(map(str, ids))
    return tokenizer.decode(ids)


def settings_line(args: argparse.Namespace) -> str:
    if args.greedy:
        return f"greedy, {args.max_new_tokens} new tokens"
    return (f"sampled (top-k {args.top_k}, temperature {args.temperature}, seed {args.seed}), "
            f"{args.max_new_tokens} new tokens")


def clock_name(device: torch.device) -> str:
    return ("CUDA events, after a warm-up run" if device.type == "cuda"
            else "CPU host clock, after a warm-up run")


