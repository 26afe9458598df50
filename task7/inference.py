"""Task 7: GPT-2 generates text with our kernels: task 4 for the prompt, task 5 for each new token.

    python -m task7.inference                       # gpt2 from the hub, the course prompt, sampled
    python -m task7.inference --greedy              # argmax decoding (deterministic)
    python -m task7.inference --random-weights      # offline: GPT-2 from its config, seeded
    python -m task7.inference --record              # what common.tools.run_all runs (records results)

The idea: keep everything of Hugging Face's GPT-2 except attention. Its own modules do the
rest (token and position embeddings wte/wpe, layer norms ln_1/ln_2/ln_f, the MLP, lm_head),
so any difference from Hugging Face's output can only come from our attention. Per layer:

    prefill (the whole prompt, once):
        q, k, v = c_attn(ln_1(x)).split(hidden)         [B, S, hidden] each, heads interleaved
        update_kv_cache(k_cache, v_cache, k, v, 0)       task 5: rows [0, S) of the cache
        flash_attention(q, k, v, causal=True)            task 4, on [B, H, S, D] head views
    decode (one token per step, at position pos):
        update_kv_cache(k_cache, v_cache, k, v, pos)     task 5: one row, no torch.cat
        decode_attention(q, k_cache, v_cache, H, pos+1)  task 5: rows [0, pos] of the cache
    then x = x + c_proj(attention), x = x + mlp(ln_2(x)), as in GPT2Block.

c_attn and c_proj are transformers' Conv1D: y = x @ W + b with W stored [in, out], the
transpose of nn.Linear's [out, in]. Calling the modules keeps that right (and bit-identical
to Hugging Face); to use their weights as w_q .. w_o of tasks 1-5 (y = x @ w.T) you would
take w_q = c_attn.weight[:, :hidden].T, and so on.

The cache is one (k_cache, v_cache) pair per layer, [B, prompt + new tokens, hidden],
allocated once (task 5 allocate_kv_cache). The kernels read strided views in place (a
contiguous last dimension is all they need): q, k, v stay slices of c_attn's output, and
flash_attention writes its heads straight into a [B, S, hidden] tensor. No copies.

The decode step reads the token and its position from device tensors (int32, advanced in
place), so it is captured once as a CUDA graph and replayed: one launch per token instead of
about 12 per layer from Python. Before use, a replay is checked against the same step run
eagerly; if capture or that check fails, the loop says so and runs eagerly. No step syncs
with the host: tokens stay on the GPU until the end, and time is read from CUDA events.

Measured: see Results.md (results/h100.json).
"""

from __future__ import annotations

if not __package__:  # run as a file, where `common` cannot be imported
    raise SystemExit("Run this from the repository root as a module: python -m task7.inference")

import argparse
import sys
from dataclasses import dataclass
from statistics import median

import torch

from common.graphs import capture_graph
from common.timing import TokenClock, TokenTiming
from task7.gpt2 import (
    ModelUnavailable,
    PromptTooLong,
    Setup,
    add_common_args,
    clock_name,
    make_setup,
    render,
    settings_line,
)
from task5.ops import BACKENDS, AttentionOps, ops_for
from task7 import manifest as M

WARMUP_TOKENS = 4
REPLAY_CHECK_ROWS = 6   # capture_decode_graph writes cache rows [0, 6) while checking a replay


# --- the two attention calls a student writes ------------------------------------------------

def attention_prefill(ops: AttentionOps, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                      k_cache: torch.Tensor, v_cache: torch.Tensor, num_heads: int) -> torch.Tensor:
    """Causal self-attention over the whole prompt; also fills cache rows [0, S).

    q, k, v: [B, S, hidden] slices of c_attn's output (heads interleaved in hidden).
    Returns [B, S, hidden], the heads merged back, ready for c_proj.
    """
    batch, seq, hidden = q.shape
    # BEGIN SOLUTION
    # HINT: Write k and v into the caches at position 0 with ops.update_kv_cache (it reads
    # HINT: strided [B, S, hidden] views in place). View q, k, v as heads without copying:
    # HINT: t.view(batch, seq, num_heads, head_dim).transpose(1, 2) is [B, H, S, D] with a
    # HINT: contiguous last dimension, which ops.flash_attention(q, k, v, causal=True, out=...)
    # HINT: takes. Give it out= the head view of a new [B, S, hidden] tensor: the kernel then
    # HINT: writes the heads already merged, and that tensor is the result.
    ops.update_kv_cache(k_cache, v_cache, k, v, 0)
    head_dim = hidden // num_heads

    def heads(t):
        return t.view(batch, seq, num_heads, head_dim).transpose(1, 2)

    merged = torch.empty(batch, seq, hidden, dtype=q.dtype, device=q.device)
    ops.flash_attention(heads(q), heads(k), heads(v), causal=True, out=heads(merged))
    return merged
    # END SOLUTION


def attention_decode(ops: AttentionOps, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                     k_cache: torch.Tensor, v_cache: torch.Tensor, num_heads: int,
                     pos: torch.Tensor | int, seq_len: torch.Tensor | int) -> torch.Tensor:
    """One new token per sequence: append its k, v at row `pos`, attend to rows [0, seq_len).

    q, k, v: [B, 1, hidden]. pos and seq_len (= pos + 1) are device int32 tensors in the
    loop (CUDA-graph friendly) or ints. Returns [B, 1, hidden].
    """
    # BEGIN SOLUTION
    # HINT: ops.update_kv_cache(k_cache, v_cache, k, v, pos) writes the new token's row;
    # HINT: ops.decode_attention(q, k_cache, v_cache, num_heads, seq_len) attends to rows
    # HINT: [0, seq_len) and returns [B, 1, hidden]. Pass pos and seq_len on as they are:
    # HINT: reading a device tensor on the host (.item()) would sync every step and break
    # HINT: the CUDA graph.
    ops.update_kv_cache(k_cache, v_cache, k, v, pos)
    return ops.decode_attention(q, k_cache, v_cache, num_heads, seq_len)
    # END SOLUTION


# --- GPT-2 on our attention ---------------------------------------------------------------------

class KernelGPT2:
    """GPT-2's forward pass on our attention, reusing a GPT2LMHeadModel's own modules.

    Owns the per-layer KV caches (room for `max_len` tokens of `batch` sequences) and the
    device-side decode state: `token` [B, 1] int64, `pos` and `seq_len` 0-d int32.
    """

    def __init__(self, model, ops: AttentionOps, max_len: int, batch: int = 1):
        config = model.config
        unsupported = [name for name, bad in (
            ("scale_attn_by_inverse_layer_idx", getattr(config, "scale_attn_by_inverse_layer_idx", False)),
            ("scale_attn_weights=False", not getattr(config, "scale_attn_weights", True)),
            ("add_cross_attention", getattr(config, "add_cross_attention", False))) if bad]
        if unsupported:
            raise ValueError(f"This GPT-2 config uses {', '.join(unsupported)}, which the loop "
                             "does not implement; use task7.inference_ref for this model.")
        if max_len > config.n_positions:
            raise PromptTooLong(f"A cache of {max_len} tokens was asked for, but GPT-2 holds only "
                                f"{config.n_positions} positions.")
        transformer = model.transformer
        self.wte, self.wpe, self.blocks = transformer.wte, transformer.wpe, transformer.h
        self.ln_f, self.lm_head = transformer.ln_f, model.lm_head
        self.hidden, self.num_heads = config.n_embd, config.n_head
        self.vocab_size = config.vocab_size
        weight = self.wte.weight
        self.device, self.dtype = weight.device, weight.dtype
        self.ops, self.batch, self.max_len = ops, batch, max_len
        self.caches = [ops.allocate_kv_cache(batch, max_len, self.hidden, self.dtype, self.device)
                       for _ in self.blocks]
        self.token = torch.zeros(batch, 1, dtype=torch.long, device=self.device)
        self.pos = torch.zeros((), dtype=torch.int32, device=self.device)
        self.seq_len = torch.ones((), dtype=torch.int32, device=self.device)
        self.graph = None           # torch.cuda.CUDAGraph of decode_step, once captured
        self._graph_logits = None   # its static output buffer
        self.graph_note = "not captured"

    def _block(self, block, x: torch.Tensor, attend) -> torch.Tensor:
        """One GPT2Block with our attention: x + c_proj(attn(ln_1 x)), then x + mlp(ln_2 x)."""
        q, k, v = block.attn.c_attn(block.ln_1(x)).split(self.hidden, dim=2)
        x = block.attn.c_proj(attend(q, k, v)) + x
        return x + block.mlp(block.ln_2(x))

    @torch.no_grad()
    def prefill(self, input_ids: torch.Tensor) -> torch.Tensor:
        """Run the prompt [B, S], filling the caches; return the last position's logits [B, V]."""
        batch, seq = input_ids.shape
        if batch != self.batch or seq > self.max_len:
            raise ValueError(f"prefill got input ids {tuple(input_ids.shape)} but the cache holds "
                             f"{self.batch} sequence(s) of up to {self.max_len} tokens.")
        positions = torch.arange(seq, device=self.device).unsqueeze(0)
        x = self.wte(input_ids) + self.wpe(positions)
        for block, (k_cache, v_cache) in zip(self.blocks, self.caches, strict=True):
            x = self._block(block, x, lambda q, k, v, kc=k_cache, vc=v_cache: attention_prefill(
                self.ops, q, k, v, kc, vc, self.num_heads))
        # As GPT2LMHeadModel under generate(): ln_f over all rows, lm_head on the last one.
        return self.lm_head(self.ln_f(x)[:, -1:, :])[:, -1, :]

    @torch.no_grad()
    def decode_step(self, token: torch.Tensor, pos: torch.Tensor, seq_len: torch.Tensor) -> torch.Tensor:
        """Logits [B, V] for `token` [B, 1] at position `pos`; appends its k, v to the caches.

        No host sync and no Python branch on tensor values: this is what the graph captures.
        """
        x = self.wte(token) + self.wpe(pos.view(1, 1))
        for block, (k_cache, v_cache) in zip(self.blocks, self.caches, strict=True):
            x = self._block(block, x, lambda q, k, v, kc=k_cache, vc=v_cache: attention_decode(
                self.ops, q, k, v, kc, vc, self.num_heads, pos, seq_len))
        return self.lm_head(self.ln_f(x))[:, -1, :]

    def step(self) -> torch.Tensor:
        """decode_step on the device state (self.token, self.pos, self.seq_len)."""
        if self.graph is not None:
            self.graph.replay()
            return self._graph_logits
        return self.decode_step(self.token, self.pos, self.seq_len)

    # -- CUDA graph ---------------------------------------------------------------------------

    def capture_decode_graph(self) -> bool:
        """Capture decode_step as a CUDA graph and check a replay against eager; True if in use.

        Call before prefill: warm-up and the check write cache rows 0..5, which the next
        prefill overwrites.
        """
        if self.device.type != "cuda":
            self.graph_note = "no CUDA graph on the CPU"
            return False
        if self.max_len < REPLAY_CHECK_ROWS:
            self.graph_note = f"not used: the cache is shorter than the {REPLAY_CHECK_ROWS} rows the check needs"
            return False
        self.graph = None
        try:
            self.token.zero_()
            self.pos.zero_()
            self.seq_len.fill_(1)
            # Warm-ups on a side stream (lazy initialisation, cuBLAS workspaces), so that
            # nothing of that is recorded, then the capture (common.graphs.capture_graph).
            graph, logits = capture_graph(
                lambda: self.decode_step(self.token, self.pos, self.seq_len), warmup=2)
            torch.cuda.synchronize()
        except NotImplementedError:
            raise
        except RuntimeError as err:
            self.graph_note = f"capture failed ({str(err).splitlines()[0][:120]}); decoding eagerly"
            return False
        self.graph, self._graph_logits = graph, logits
        matches, detail = self._replay_matches_eager()
        if not matches:
            self.graph = None
            self.graph_note = f"a replay differed from the eager step ({detail}); decoding eagerly"
            return False
        self.graph_note = f"captured; a replay matches the eager step ({detail})"
        return True

    def _replay_matches_eager(self) -> tuple[bool, str]:
        """Decode 5 tokens eagerly, then the 6th both eagerly and by replay: same logits?

        A graph that froze the position it was captured at (pos 0) fails this at pos 5.
        """
        self.pos.zero_()
        self.seq_len.fill_(1)
        for t in range(5):
            self.token.fill_((t + 1) % self.vocab_size)
            self.decode_step(self.token, self.pos, self.seq_len)
            self.pos.add_(1)
            self.seq_len.add_(1)
        self.token.fill_(7 % self.vocab_size)
        eager = self.decode_step(self.token, self.pos, self.seq_len).float().clone()
        self.graph.replay()   # rewrites row 5 with the same k, v: harmless
        replay = self._graph_logits.float()
        diff = (replay - eager).abs().max().item()
        scale = max(1.0, eager.abs().max().item())
        return diff <= 1e-3 * scale, f"max |diff| {diff:.1e}"


# --- choosing the next token ----------------------------------------------------------------------

def select_next_token(logits: torch.Tensor, *, greedy: bool, top_k: int, temperature: float,
                      generator: torch.Generator | None) -> torch.Tensor:
    """[B, V] logits -> [B] token ids: argmax, or a top-k sample at `temperature` (on the device)."""
    if greedy:
        return torch.argmax(logits, dim=-1)
    scores = logits.float() / temperature
    values, indices = torch.topk(scores, min(top_k, scores.shape[-1]), dim=-1)
    choice = torch.multinomial(torch.softmax(values, dim=-1), 1, generator=generator)
    return indices.gather(-1, choice).squeeze(-1)


@dataclass
class Generation:
    ids: torch.Tensor             # [B, N] new token ids
    first_logits: torch.Tensor    # [B, V] fp32 logits of the first step (after the prompt)
    timing: TokenTiming
    cuda_graph: bool


@torch.no_grad()
def generate(runner: KernelGPT2, input_ids: torch.Tensor, max_new_tokens: int, *,
             greedy: bool, top_k: int = 10, temperature: float = 0.95, seed: int = 0,
             use_graph: bool = True) -> Generation:
    """Prefill the prompt, then decode max_new_tokens - 1 steps; every step on the device."""
    batch, prompt_len = input_ids.shape
    if max_new_tokens < 1 or prompt_len + max_new_tokens > runner.max_len:
        raise ValueError(f"{prompt_len} prompt tokens + {max_new_tokens} new ones do not fit the "
                         f"cache of {runner.max_len} tokens (make the runner with a larger max_len).")
    graph = runner.graph if use_graph else None
    saved, runner.graph = runner.graph, graph
    generator = None
    if not greedy:
        generator = torch.Generator(device=runner.device)
        generator.manual_seed(seed)
    new_ids = torch.empty(batch, max_new_tokens, dtype=torch.long, device=runner.device)
    clock = TokenClock(runner.device, max_new_tokens)
    try:
        clock.start()
        first_logits = runner.prefill(input_ids)
        clock.mark()
        new_ids[:, 0] = select_next_token(first_logits, greedy=greedy, top_k=top_k,
                                          temperature=temperature, generator=generator)
        # fill_ with a Python int is a kernel launch, not a sync; the positions then advance
        # in place, which is what a replayed graph sees.
        runner.pos.fill_(prompt_len)
        runner.seq_len.fill_(prompt_len + 1)
        for i in range(1, max_new_tokens):
            runner.token.copy_(new_ids[:, i - 1:i])
            logits = runner.step()
            clock.mark()
            new_ids[:, i] = select_next_token(logits, greedy=greedy, top_k=top_k,
                                              temperature=temperature, generator=generator)
            runner.pos.add_(1)
            runner.seq_len.add_(1)
        timing = TokenTiming.from_marks(clock.times_ms())
    finally:
        runner.graph = saved
    return Generation(new_ids, first_logits.float(), timing, graph is not None)


def make_runner(setup: Setup, backend: str, max_new_tokens: int, cuda_graph: bool) -> KernelGPT2:
    runner = KernelGPT2(setup.model, ops_for(setup.device, backend),
                        max_len=setup.input_ids.shape[1] + max_new_tokens,
                        batch=setup.input_ids.shape[0])
    if cuda_graph:
        runner.capture_decode_graph()
    return runner


# --- the program ---------------------------------------------------------------------------------

def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m task7.inference", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    add_common_args(parser)
    parser.add_argument("--attention", choices=BACKENDS, default="auto",
                        help="kernels (ours, CUDA), torch (SDPA, any device), auto (default: "
                             "kernels on a GPU, torch on a CPU)")
    parser.add_argument("--no-cuda-graph", action="store_true",
                        help="run the decode step eagerly instead of replaying a CUDA graph")
    parser.add_argument("--record", action="store_true",
                        help="also generate greedy and sampled text, time stock generate, and "
                             "record both in results/<gpu>.json (GPU only)")
    parser.add_argument("--repeats", type=int, default=3,
                        help="with --record: timed generations per path (median reported)")
    return parser


def _say(message: str) -> None:
    print(f"[task7.inference] {message}", flush=True)


def _load(args: argparse.Namespace) -> Setup:
    """make_setup, except that --record falls back to random weights when the hub is unreachable."""
    try:
        return make_setup(args)
    except ModelUnavailable as err:
        if not args.record or args.random_weights:
            raise
        _say(f"{err} --record goes on with --random-weights instead.")
        args.random_weights = True
        setup = make_setup(args)
        setup.label += f" (fallback: {args.model!r} could not be loaded)"
        return setup


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    from common.build import BuildError

    try:
        setup = _load(args)
    except ModelUnavailable as err:
        _say(str(err))
        return 1
    except (PromptTooLong, ValueError) as err:
        _say(str(err))
        return 2
    use_graph = setup.device.type == "cuda" and not args.no_cuda_graph
    try:
        runner = make_runner(setup, args.attention, args.max_new_tokens, use_graph)
    except NotImplementedError as err:
        _say(f"not implemented yet: {err}")
        return 1
    except (BuildError, ImportError, ValueError) as err:
        _say(str(err).splitlines()[0] if str(err) else type(err).__name__)
        return 1
    try:
        return _generate_and_print(args, setup, runner)
    except NotImplementedError as err:
        _say(f"not implemented yet: {err}")
        return 1


def _generate_and_print(args: argparse.Namespace, setup: Setup, runner: KernelGPT2) -> int:
    device_name = torch.cuda.get_device_name() if setup.device.type == "cuda" else "CPU"
    attention = ("our kernels (task 4 prefill, task 5 decode)" if runner.ops.name == "kernels"
                 else "PyTorch SDPA standing in for the task 4 and 5 kernels")
    _say(f"{setup.label}, {args.dtype}, {device_name}; attention: {attention}; "
         f"CUDA graph: {runner.graph_note}")
    _say(setup.note)
    options = dict(greedy=args.greedy, top_k=args.top_k, temperature=args.temperature,
                   seed=args.seed)
    generate(runner, setup.input_ids, min(WARMUP_TOKENS, args.max_new_tokens), **options)
    result = generate(runner, setup.input_ids, args.max_new_tokens, **options)
    print(f"\n--- prompt ---\n{render(setup.tokenizer, setup.input_ids[0])}")
    print(f"--- generated: {settings_line(args)} ---\n{render(setup.tokenizer, result.ids[0])}\n")
    _say(result.timing.line(clock_name(setup.device)))
    if args.record:
        return record_run(args, setup, runner)
    return 0


# --- --record: texts and timings for Results.md -------------------------------------------------

def _labelled_text(setup: Setup, args: argparse.Namespace, ids: torch.Tensor, greedy: bool) -> str:
    mode = "greedy" if greedy else f"top-k {args.top_k}, temperature {args.temperature}, seed {args.seed}"
    label = f"[{setup.label}, {args.dtype}, {mode}; {args.max_new_tokens} new tokens"
    label += "; no tokenizer: token ids]" if setup.tokenizer is None else "]"
    prompt = render(setup.tokenizer, setup.input_ids[0])
    text = render(setup.tokenizer, ids[0])
    if setup.tokenizer is None:
        return f"{label}\nprompt {prompt}\ngenerated {text}"
    return f"{label}\n{prompt}{text}"


def record_run(args: argparse.Namespace, setup: Setup, runner: KernelGPT2) -> int:
    """Greedy and sampled texts, and TBT of ours vs stock generate (same settings), recorded."""
    from task7.inference_ref import hf_generate

    sampled = dict(top_k=args.top_k, temperature=args.temperature, seed=args.seed)
    n = args.max_new_tokens
    greedy = generate(runner, setup.input_ids, n, greedy=True, **sampled)
    sample = generate(runner, setup.input_ids, n, greedy=False, **sampled)
    texts = {M.TEXT_GREEDY: _labelled_text(setup, args, greedy.ids, True),
             M.TEXT_SAMPLED: _labelled_text(setup, args, sample.ids, False)}

    # Timed: the course settings (sampled), several runs each, after the warm-ups above.
    hf_generate(setup.model, setup.input_ids, WARMUP_TOKENS, greedy=False, **sampled)
    ours = [generate(runner, setup.input_ids, n, greedy=False, **sampled).timing
            for _ in range(max(1, args.repeats))]
    ref = [hf_generate(setup.model, setup.input_ids, n, greedy=False, **sampled)[2]
           for _ in range(max(1, args.repeats))]
    tbt, ref_tbt = median([t.tbt_ms for t in ours]), median([t.tbt_ms for t in ref])
    ttft, ref_ttft = median([t.ttft_ms for t in ours]), median([t.ttft_ms for t in ref])
    metrics = {
        M.TBT_MS: tbt, M.REF_TBT_MS: ref_tbt, M.TBT_SPEEDUP: ref_tbt / tbt,
        M.TTFT_MS: ttft, M.REF_TTFT_MS: ref_ttft, M.TTFT_SPEEDUP: ref_ttft / ttft,
        M.TOKENS_PER_S: median([t.tokens_per_s for t in ours]),
        M.REF_TOKENS_PER_S: median([t.tokens_per_s for t in ref]),
        M.CUDA_GRAPH: 1.0 if runner.graph is not None else 0.0,
    }
    _say(f"ours: TBT {tbt:.3f} ms, TTFT {ttft:.2f} ms; stock generate: TBT {ref_tbt:.3f} ms, "
         f"TTFT {ref_ttft:.2f} ms; TBT speedup {ref_tbt / tbt:.2f}x (median of {len(ours)} runs)")
    if setup.device.type != "cuda":
        _say("not recorded: --record writes results/<gpu>.json on a GPU only.")
        return 0
    from common.results import record

    path = record(metrics, texts)
    _say(f"recorded {len(metrics) + len(texts)} figures in {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

