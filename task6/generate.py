"""Task 6: generation, prefill then one decode step per new token, each step a CUDA graph.

    tokens = generate(model, prompt_tokens, max_new_tokens=100)

Time to first token (TTFT) is the prefill: one forward over the whole prompt, whose last
logits give the first new token. Time between tokens (TBT) is one decode step: a forward
over one token per sequence against the KV cache.

Why a CUDA graph: at the course size a decode step is some 17 kernels per layer, 24 layers,
about 400 launches. Launched from Python through nn.Modules, each costs on the order of 10 us
of host time: several ms a step, a large part of the time the GPU needs to read the fp32
weights once (26 GB at ~3 TB/s, ~8.6 ms; half that in bf16). A CUDA graph records
the whole step once (all layers, lm_head, argmax) and replays it with one launch. It replays
the same kernels on the same addresses, so everything that changes from step to step lives
in static tensors that the kernels read on the device: the input token, and the position as a
CUDA int32 tensor (RoPE indexes its tables with it; update_kv_cache writes there and the
decode kernel attends to position + 1 tokens). The graph itself writes the next token into
the input and advances the position, so each step is just `graph.replay()`.

generate_paged does the same for a batch of prompts of different lengths on a paged KV cache
(task5's decode_paged.cu and PageAllocator): each prompt prefilled alone in chunks of up to
16 tokens, then one decode step for the batch per token, each sequence stopping at its own
length with its pages freed at once; its graph reads the allocator's block table and lengths,
which the host updates in place between replays.

Timing (when `timings` is a dict and the model is on a GPU) uses CUDA events recorded on the
stream: TTFT from before the prefill to after the first token; TBT = the decode loop's time
divided by its steps. The graph capture is set-up, outside both.
"""

from __future__ import annotations

import torch

from common.graphs import capture_graph
from common.timing import TokenClock, TokenTiming
from task6.model import KVCache, PagedKVCache, customModel


class GraphDecodeStep:
    """One greedy decode step of `model` over `kv_cache`, captured once in a CUDA graph.

    token [B, 1]: the token fed to the step (input), then the token it chose (output).
    position: 0-d int32, the cache position of `token`; the step advances it by one.
    logits [B, vocab]: the step's last logits (valid until the next replay).
    """

    WARMUP_STEPS = 2

    def __init__(self, model: customModel, kv_cache: KVCache, first_token: torch.Tensor,
                 position: int):
        self.token = first_token.reshape(-1, 1).clone()
        self.position = torch.tensor(position, dtype=torch.int32, device=first_token.device)

        def step() -> torch.Tensor:
            logits, _ = model(self.token, kv_cache, self.position, last_logits_only=True)
            last = logits[:, -1]
            self.token.copy_(last.argmax(dim=-1, keepdim=True))
            self.position.add_(1)
            return last

        # Warm-ups on a side stream, then the capture (common.graphs.capture_graph). Each
        # warm-up starts from the saved token and position, so they all write the cache at
        # `position` with the token the first real step feeds: the same values it will write
        # again, and nothing beyond the cache's end.
        saved_token, saved_position = self.token.clone(), self.position.clone()

        def restore() -> None:
            self.token.copy_(saved_token)
            self.position.copy_(saved_position)

        self.graph, self.logits = capture_graph(step, warmup=self.WARMUP_STEPS, reset=restore)
        # One replay, undone like the warm-ups: the first launch of a graph also uploads it to
        # the GPU, a one-time cost that is not part of the time between tokens.
        self.graph.replay()
        restore()

    def __call__(self) -> tuple[torch.Tensor, torch.Tensor]:
        """Run one step; return (the chosen tokens [B], the step's logits [B, vocab])."""
        self.graph.replay()
        return self.token[:, 0], self.logits


def _pick(last_logits: torch.Tensor, greedy: bool, temperature: float, generator) -> torch.Tensor:
    if greedy:
        return last_logits.argmax(dim=-1)
    probs = torch.softmax(last_logits.float() / temperature, dim=-1)
    return torch.multinomial(probs, 1, generator=generator)[:, 0]


@torch.no_grad()
def generate(model: customModel, prompt_tokens: torch.Tensor, max_new_tokens: int,
             greedy: bool = True, use_cuda_graph: bool = True, *, kv_cache: KVCache | None = None,
             temperature: float = 1.0, generator: torch.Generator | None = None,
             timings: dict | None = None, progress: bool = False, return_logits: bool = False):
    """Generate max_new_tokens tokens after prompt_tokens [B, P]; return them, [B, max_new_tokens].

    greedy: argmax (default); else sampling at `temperature` (eager: no graph).
    use_cuda_graph: replay each decode step as one CUDA graph (on a GPU, greedy); else eager.
    kv_cache: a preallocated cache (model.allocate_kv_cache) of >= P + max_new_tokens - 1
        positions; by default one of P + max_new_tokens positions is allocated, once.
    timings: a dict filled, on a GPU, with ttft_ms, tbt_ms (mean), step_ms (each step),
        decode_steps.
    progress: a tqdm bar over the decode steps.
    return_logits: also return the logits that chose each token, [B, max_new_tokens, vocab].
    """
    if not isinstance(max_new_tokens, int) or max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be an int >= 1 (got {max_new_tokens!r}).")
    if not isinstance(prompt_tokens, torch.Tensor) or prompt_tokens.dim() != 2:
        raise ValueError("prompt_tokens must be a [batch, prompt_len] tensor of token ids.")
    batch, prompt_len = prompt_tokens.shape
    # The last new token is returned, never fed back: P + max_new_tokens - 1 positions are used.
    needed = prompt_len + max_new_tokens - 1
    if needed > model.max_seq_len:
        raise ValueError(f"prompt ({prompt_len}) + max_new_tokens ({max_new_tokens}) - 1 = {needed} "
                         f"positions exceed the model's max_seq_len {model.max_seq_len}.")
    if kv_cache is None:
        kv_cache = model.allocate_kv_cache(batch, min(prompt_len + max_new_tokens, model.max_seq_len))
    elif kv_cache and kv_cache[0][0].shape[1] < needed:
        raise ValueError(f"kv_cache holds {kv_cache[0][0].shape[1]} positions but this generation "
                         f"needs {needed}.")
    device = prompt_tokens.device
    on_gpu = device.type == "cuda"
    graph = use_cuda_graph and greedy and on_gpu
    # CUDA events: mark 0 when the first token is chosen, mark 1 when the decode loop starts
    # (after the graph capture, which TBT must not include), mark i + 1 after step i.
    clock = TokenClock(device, max_new_tokens + 1) if on_gpu and (timings is not None or progress) \
        else None

    tokens = torch.empty(batch, max_new_tokens, dtype=torch.long, device=device)
    all_logits = (torch.empty(batch, max_new_tokens, model.vocab_size, dtype=model.dtype,
                              device=device) if return_logits else None)

    # Prefill: the whole prompt at once; its last logits choose the first new token.
    if clock is not None:
        clock.start()
    logits, _ = model(prompt_tokens, kv_cache, 0, last_logits_only=True)
    tokens[:, 0] = _pick(logits[:, -1], greedy, temperature, generator)
    if all_logits is not None:
        all_logits[:, 0] = logits[:, -1]
    if clock is not None:
        clock.mark()

    # Decode: step i feeds token i - 1 at cache position P + i - 1 and chooses token i.
    steps = max_new_tokens - 1
    if steps:
        graph_step = GraphDecodeStep(model, kv_cache, tokens[:, 0], prompt_len) if graph else None

        def decode_step(i: int) -> tuple[torch.Tensor, torch.Tensor]:
            if graph_step is not None:
                return graph_step()
            out, _ = model(tokens[:, i - 1:i], kv_cache, prompt_len + i - 1, last_logits_only=True)
            return _pick(out[:, -1], greedy, temperature, generator), out[:, -1]

        bar = _progress_bar(steps, progress)
        if clock is not None:
            clock.mark()
        for i in range(1, max_new_tokens):
            chosen, last_logits = decode_step(i)
            tokens[:, i] = chosen
            if all_logits is not None:
                all_logits[:, i] = last_logits
            if clock is not None:
                clock.mark()
            if bar is not None:
                # Wait for the step before this one, not this one: the GPU always has the next
                # step queued, so the bar is accurate to one step and costs no idle time.
                if clock is not None:
                    clock.wait(i)
                bar.update(1)
        if bar is not None:
            bar.close()

    if timings is not None and clock is not None:
        marks_ms = clock.times_ms()
        timings["ttft_ms"] = marks_ms[0]
        timings["decode_steps"] = steps
        if steps:
            decode = TokenTiming.from_marks(marks_ms[1:])   # from the loop's start
            timings["tbt_ms"] = decode.tbt_ms
            timings["step_ms"] = decode.step_ms
    return (tokens, all_logits) if return_logits else tokens


# --- a batch of prompts of different lengths on a paged KV cache ------------------------------

PREFILL_CHUNK = 16   # prompt tokens per forward on the paged kernel (it takes up to 16 rows)


class PagedGraphStep:
    """One greedy decode step of every sequence of a paged cache, captured once in a CUDA graph.

    It reads the token [B, 1] it is fed, the allocator's seq_lens and block_table (the lengths
    with this step's token counted, and its pages given, by the host before each replay), and
    writes the chosen token back into `token`. Adding pages and raising lengths changes the
    tensors' values, never their addresses, so the graph stays valid as the sequences grow.
    """

    WARMUP_STEPS = 2

    def __init__(self, model: customModel, cache: PagedKVCache, first_token: torch.Tensor):
        self.token = first_token.reshape(-1, 1).clone()
        allocator = cache.allocator

        def step() -> torch.Tensor:
            logits = model.forward_paged(self.token, cache, allocator.seq_lens,
                                         last_logits_only=True)
            self.token.copy_(logits[:, -1].argmax(dim=-1, keepdim=True))
            return logits[:, -1]

        # The warm-ups and the capture write the cache at the first step's positions with the
        # token it feeds: the values the first replay writes again.
        saved = self.token.clone()
        self.graph, self.logits = capture_graph(step, warmup=self.WARMUP_STEPS,
                                                reset=lambda: self.token.copy_(saved))
        self.graph.replay()            # the first launch uploads the graph; undone as above
        self.token.copy_(saved)

    def __call__(self) -> torch.Tensor:
        self.graph.replay()
        return self.token[:, 0]


@torch.no_grad()
def generate_paged(model: customModel, prompts: list[torch.Tensor], max_new_tokens,
                   *, page_size: int = 16, num_pages: int | None = None,
                   use_cuda_graph: bool = True, shuffle: int | None = None,
                   cache: PagedKVCache | None = None) -> list[torch.Tensor]:
    """Greedy generation for a batch of prompts of different lengths on a paged KV cache.

    prompts: B 1-d tensors of token ids (any lengths >= 1); max_new_tokens: an int, or one per
    prompt: sequence b stops after its own count, and its pages go back to the allocator at
    once (a longer sequence may then take them). Each prompt is prefilled alone, in chunks of
    PREFILL_CHUNK tokens; then one decode step for the whole batch per token (as a CUDA graph
    on a GPU with the kernels, use_cuda_graph), a finished sequence's slot running on with
    length 0 (it reads no key and writes no page). num_pages: default, enough for every
    sequence at its longest. Returns B tensors [max_new_tokens_b] of token ids, which equal
    generate()'s for each prompt alone (contiguous cache) up to rounding.
    """
    if not isinstance(prompts, (list, tuple)) or not prompts:
        raise ValueError("prompts must be a non-empty list of 1-d tensors of token ids.")
    for b, prompt in enumerate(prompts):
        if not isinstance(prompt, torch.Tensor) or prompt.dim() != 1 or prompt.numel() < 1:
            raise ValueError(f"prompts[{b}] must be a 1-d tensor of at least one token id.")
    batch = len(prompts)
    counts = [max_new_tokens] * batch if isinstance(max_new_tokens, int) else list(max_new_tokens)
    if len(counts) != batch or any(not isinstance(n, int) or n < 1 for n in counts):
        raise ValueError(f"max_new_tokens must be an int >= 1 or one such int per prompt "
                         f"({batch}), not {max_new_tokens!r}.")
    lengths = [int(p.numel()) + n - 1 for p, n in zip(prompts, counts, strict=True)]
    if max(lengths) > model.max_seq_len:
        raise ValueError(f"a prompt plus its new tokens needs {max(lengths)} positions, beyond "
                         f"the model's max_seq_len {model.max_seq_len}.")
    if cache is None:
        needed = sum(-(-n // page_size) for n in lengths)
        cache = model.allocate_paged_kv_cache(batch, num_pages or needed, page_size,
                                              max_len=max(lengths), shuffle=shuffle)
    alloc = cache.allocator
    device = model.device

    # Prefill, one prompt at a time (its own row of the block table), in chunks.
    tokens = [torch.empty(n, dtype=torch.long, device=device) for n in counts]
    for b, prompt in enumerate(prompts):
        prompt = prompt.to(device).long()
        for start in range(0, prompt.numel(), PREFILL_CHUNK):
            chunk = prompt[start:start + PREFILL_CHUNK]
            alloc.append(b, chunk.numel())
            logits = model.forward_paged(chunk[None], cache, alloc.seq_lens[b:b + 1],
                                         alloc.block_table[b:b + 1], last_logits_only=True)
        tokens[b][0] = logits[0, -1].argmax()

    # Decode: every step feeds each live sequence its last token; a sequence that has all its
    # tokens is freed before the next step.
    live = [n > 1 for n in counts]
    for b in range(batch):
        if not live[b]:
            alloc.free(b)
    graph = use_cuda_graph and device.type == "cuda" and model.attention_backend == "custom"
    current = torch.stack([t[0] for t in tokens]).view(batch, 1)
    graph_step = None
    for i in range(1, max(counts)):
        alloc.append_many({b: 1 for b in range(batch) if live[b]})
        if graph and graph_step is None:
            graph_step = PagedGraphStep(model, cache, current)
        if graph_step is not None:
            chosen = graph_step()
        else:
            logits = model.forward_paged(current, cache, alloc.seq_lens, last_logits_only=True)
            chosen = logits[:, -1].argmax(dim=-1)
            current = chosen.view(batch, 1)
        for b in range(batch):
            if live[b]:
                tokens[b][i] = chosen[b]
                if i == counts[b] - 1:
                    live[b] = False
                    alloc.free(b)
    return tokens


def _progress_bar(total: int, enabled: bool):
    if not enabled:
        return None
    try:
        from tqdm import tqdm
    except ImportError:   # tqdm is in requirements.txt, but a bar is not worth a crash
        return None
    return tqdm(total=total, desc="decode", unit="tok", leave=False)
