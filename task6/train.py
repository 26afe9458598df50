"""Beyond the course (issue 33): train on our kernels, forward and backward, beside SDPA.

    python -m task6.train                            # both models, fp32, 300 steps each
    python -m task6.train --model gpt2 --steps 100   # one model, fewer steps
    python -m task6.train --dtype bf16               # bf16 compute, fp32 master weights
    python -m task6.train --seed-noise               # also SDPA from other weights: the seed noise
    python -m task6.train --plot-only                # redraw the plot from the saved curves (CPU too)

Two models learn the repository's small text (task6/data/public_domain.txt, 16 KB of
public-domain English transcribed for this repository, not a checked edition; characters as
tokens: no tokenizer, no network):

  * task6  task 6's customModel (task6/model.py) in a small configuration, its prefill path
           unfused (fused_prefill=False: attend_custom -> task 4's flash_attention, whose
           backward is task4/backward.py) against the same model with attention="torch"
           (F.scaled_dot_product_attention);
  * gpt2   a random-init GPT-2 from transformers (model.train(), dropout 0) with
           attn_implementation "course_kernels" (task7/hf_attention.py) against "sdpa".

Each model is built once and copied, so both runs start from the same weights; both see the
same batches in the same order (seeded offsets into the text), with AdamW, a linear warm-up of
the learning rate and gradient clipping. The steps of the two runs alternate in one process
(ours, SDPA, SDPA, ours, ...: the order flips every step), so a drift of the GPU clock
reaches both alike.

What is reported, per model:
  * the loss curves (results/train_<gpu>_curves.json; the plot results/train_<gpu>.png);
  * loss gap = |mean of our last N losses - mean of SDPA's last N| / standard deviation of
    SDPA's last N (N = --last, 50), the issue's criterion: the curves match within noise when
    it is <= 1.0, i.e. our final loss sits inside the step-to-step spread of SDPA's. The
    spread is the batch-to-batch noise of the training loss at the end of the run; the two runs
    differ only by rounding in attention, which grows over the steps but must stay inside it.
    --seed-noise adds a third run, SDPA from weights drawn with another seed, and prints the
    same gap between the two SDPA runs: what a different seed alone moves (informative);
  * step time: the median over the steps after --timing-warmup of the time from the step's
    first kernel to its optimizer update (CUDA events), ours and SDPA's, and SDPA / ours;
  * fallbacks: attention calls, forward or backward, that did not run on our kernels. The
    kernel entries of task4/backward.py are counted while the run lasts; every layer of every
    step must have called both once (layers x steps each), and transformers' fallback counter
    (task7/hf_attention.py) must stay 0. The SDPA runs call none of them.

dtypes: fp32 runs task 4's fp32 forward and the lesson backward (task4/flash_backward.cu).
fp16 and bf16 go through the same autograd entry (the tensor-core forward; the backward as
task4/backward.py runs it for those dtypes today); the model then computes in that dtype and
AdamW updates fp32 master copies of its weights (no loss scaling). Each
run's figures go to results/<gpu>.json (task6/manifest.py names them: task6.train.<model>.
<dtype>.<field>, and the issue's task6.train.loss_gap, task6.train.step_time_ratio_vs_sdpa,
task7.hf.train.gpt2.{fallbacks,loss_gap} from fp32 runs). Exit status 0 when every check
passes: loss gap <= 1, 0 fallbacks, finite losses that fell.
"""

from __future__ import annotations

if not __package__:  # run as a file, where `common` cannot be imported
    raise SystemExit("Run this from the repository root as a module: python -m task6.train")

import argparse
import contextlib
import copy
import json
import math
import statistics
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
import torch.nn.functional as F

from task6.manifest import (TRAIN_GAP_TARGET, TRAIN_HEADLINE_DTYPE, TRAIN_MODELS,
                            train_headline_metrics, train_metric)

DATA_PATH = Path(__file__).resolve().parent / "data" / "public_domain.txt"
DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}
DEFAULT_DTYPE = "fp32"


# --- data: characters as tokens ---------------------------------------------------------------

@dataclass
class CharData:
    """A text as token ids: one id per distinct character (sorted), the same for both models."""

    text: str
    chars: str
    ids: torch.Tensor           # [len(text)] int64

    @classmethod
    def from_text(cls, text: str) -> CharData:
        if len(text) < 2:
            raise ValueError("the training text needs at least 2 characters.")
        chars = "".join(sorted(set(text)))
        index = {c: i for i, c in enumerate(chars)}
        return cls(text, chars, torch.tensor([index[c] for c in text], dtype=torch.long))

    @classmethod
    def load(cls, path: Path | str = DATA_PATH) -> CharData:
        path = Path(path)
        if not path.exists():
            raise FileNotFoundError(f"no training text at {path}; pass --text FILE.")
        return cls.from_text(path.read_text(encoding="utf-8"))

    @property
    def vocab_size(self) -> int:
        return len(self.chars)

    def decode(self, ids) -> str:
        return "".join(self.chars[int(i)] for i in ids)


def batch_offsets(n_tokens: int, seq: int, batch: int, steps: int, seed: int) -> torch.Tensor:
    """[steps, batch] start positions of the training windows, seeded: the data order."""
    if n_tokens < seq + 2:
        raise ValueError(f"the text has {n_tokens} tokens, too few for windows of {seq} + 1.")
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(0, n_tokens - seq, (steps, batch), generator=gen)


def get_batch(ids: torch.Tensor, offsets: torch.Tensor, seq: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Inputs [B, seq] and next-token targets [B, seq] of the windows starting at offsets [B]."""
    rows = offsets[:, None] + torch.arange(seq + 1, device=offsets.device)
    window = ids[rows]
    return window[:, :-1], window[:, 1:]


# --- the criterion ----------------------------------------------------------------------------

def loss_gap(ours: list[float], reference: list[float], last: int = 50) -> float:
    """|mean(ours[-last:]) - mean(reference[-last:])| / stdev(reference[-last:]) (the issue's
    criterion; <= 1 means our final loss lies within the reference's step-to-step noise)."""
    if last < 2:
        raise ValueError(f"last must be >= 2 (a standard deviation needs two values), got {last}.")
    if len(ours) < last or len(reference) < last:
        raise ValueError(f"the curves have {len(ours)} and {len(reference)} losses; the gap "
                         f"compares the last {last} of each.")
    a, b = ours[-last:], reference[-last:]
    diff = abs(statistics.fmean(a) - statistics.fmean(b))
    spread = statistics.stdev(b)
    if spread == 0.0:
        return 0.0 if diff == 0.0 else math.inf
    return diff / spread


def within_noise(ours: list[float], reference: list[float], last: int = 50,
                 target: float = TRAIN_GAP_TARGET) -> bool:
    gap = loss_gap(ours, reference, last)
    return math.isfinite(gap) and gap <= target


def smooth(values: list[float], window: int) -> list[float]:
    """Trailing moving average (the first points average what there is): for the plot."""
    out, total = [], 0.0
    for i, v in enumerate(values):
        total += v
        if i >= window:
            total -= values[i - window]
        out.append(total / min(i + 1, window))
    return out


# --- counting our kernels ---------------------------------------------------------------------

@dataclass
class KernelCalls:
    forward: int = 0
    backward: int = 0


@contextlib.contextmanager
def count_kernel_calls() -> Iterator[KernelCalls]:
    """Count the calls of task4/backward.py's two kernel entries (the differentiable forward,
    which also saves the log-sum-exp, and the backward) while the block runs. The custom
    operators look both names up at each call, so wrapping them here counts every call."""
    from task4 import backward

    calls = KernelCalls()
    forward, backward_fn = backward.kernel_forward, backward.kernel_backward

    def counted_forward(*args, **kwargs):
        calls.forward += 1
        return forward(*args, **kwargs)

    def counted_backward(*args, **kwargs):
        calls.backward += 1
        return backward_fn(*args, **kwargs)

    backward.kernel_forward, backward.kernel_backward = counted_forward, counted_backward
    try:
        yield calls
    finally:
        backward.kernel_forward, backward.kernel_backward = forward, backward_fn


# --- the models -------------------------------------------------------------------------------

@dataclass
class TrainConfig:
    steps: int = 300
    batch: int = 16
    seq: int = 128
    hidden: int = 128
    heads: int = 2
    layers: int = 4
    lr: float = 2e-3
    lr_warmup: int = 20
    clip: float = 1.0
    seed: int = 0               # the weights
    data_seed: int = 1          # the batches
    last: int = 50              # losses the gap compares
    timing_warmup: int = 10     # steps left out of the step-time median
    dtype: str = DEFAULT_DTYPE

    def check(self) -> None:
        for name in ("steps", "batch", "seq", "hidden", "heads", "layers"):
            if getattr(self, name) < 1:
                raise ValueError(f"--{name} must be >= 1, got {getattr(self, name)}.")
        if self.hidden % self.heads:
            raise ValueError(f"--hidden {self.hidden} is not divisible by --heads {self.heads}.")
        if not 2 <= self.last <= self.steps:
            raise ValueError(f"--last {self.last} must be in [2, --steps {self.steps}].")
        if not 0 <= self.timing_warmup < self.steps:
            raise ValueError(f"--timing-warmup {self.timing_warmup} must be in [0, --steps).")
        if self.dtype not in DTYPES:
            raise ValueError(f"--dtype must be one of {', '.join(DTYPES)}, got {self.dtype!r}.")


@dataclass
class Pair:
    """The two models of one comparison (same weights) and how to get logits from each."""

    ours: torch.nn.Module
    sdpa: torch.nn.Module
    logits: Callable[[torch.nn.Module, torch.Tensor], torch.Tensor]
    attention_layers: int
    other_seed: Callable[[int], torch.nn.Module] | None = None   # SDPA from other weights


def _trainable(model: torch.nn.Module) -> torch.nn.Module:
    model.requires_grad_(True)
    return model.train()


def task6_pair(cfg: TrainConfig, vocab: int, device, ours_attention: str = "custom") -> Pair:
    """Task 6's model: ours on the kernels (unfused prefill path), the copy on PyTorch's SDPA.
    ours_attention="torch" puts both on PyTorch (the CPU tests check the loop that way)."""
    from task6.model import customModel

    def build(seed: int, attention: str):
        model = customModel(cfg.hidden, cfg.heads, cfg.layers, vocab, max_seq_len=cfg.seq,
                            attention=attention, device=device, dtype=DTYPES[cfg.dtype],
                            seed=seed, fused_decode=False, fused_prefill=False)
        return _trainable(model)

    ours = build(cfg.seed, ours_attention)
    sdpa = copy.deepcopy(ours)
    sdpa.attention_backend = "torch"
    # A prefill without a cache: the model allocates one of max_seq_len (= seq) positions per
    # call and writes k and v into it, on both paths (the same few copies each).
    return Pair(ours, sdpa, lambda model, x: model(x)[0], cfg.layers,
                other_seed=lambda seed: build(seed, "torch"))


def gpt2_config(cfg: TrainConfig, vocab: int):
    import transformers as tf

    return tf.GPT2Config(vocab_size=vocab, n_positions=cfg.seq, n_embd=cfg.hidden,
                         n_layer=cfg.layers, n_head=cfg.heads, resid_pdrop=0.0,
                         embd_pdrop=0.0, attn_pdrop=0.0, bos_token_id=0, eos_token_id=0)


def gpt2_pair(cfg: TrainConfig, vocab: int, device, ours_attention: str | None = None) -> Pair:
    """A random-init GPT-2 (transformers): ours with attn_implementation "course_kernels",
    the copy with "sdpa"."""
    from transformers import AutoModelForCausalLM

    from task7.hf_attention import NAME, set_attention, use_course_attention

    def build(seed: int):
        torch.manual_seed(seed)
        model = AutoModelForCausalLM.from_config(gpt2_config(cfg, vocab),
                                                 attn_implementation="sdpa")
        return _trainable(model.to(device=device, dtype=DTYPES[cfg.dtype]))

    sdpa = build(cfg.seed)
    ours = copy.deepcopy(sdpa)
    if (ours_attention or NAME) == NAME:
        use_course_attention(ours)
    else:
        set_attention(ours, ours_attention)

    def logits(model, x):
        return model(input_ids=x, use_cache=False).logits

    return Pair(ours, sdpa, logits, cfg.layers, other_seed=build)


PAIRS = {"task6": task6_pair, "gpt2": gpt2_pair}
assert tuple(PAIRS) == TRAIN_MODELS


# --- training ---------------------------------------------------------------------------------

@dataclass
class Run:
    name: str
    model: torch.nn.Module
    optimizer: Optimizer
    losses: list[torch.Tensor] = field(default_factory=list)
    times: list = field(default_factory=list)        # (start, end) events, or host seconds


def _lr_at(step: int, cfg: TrainConfig) -> float:
    return cfg.lr * min(1.0, (step + 1) / max(cfg.lr_warmup, 1))


def train_runs(runs: list[Run], logits: Callable, data: CharData, cfg: TrainConfig, device,
               progress: bool = True) -> None:
    """Every run takes the same batch at each step; the order of the runs flips every step."""
    offsets = batch_offsets(len(data.ids), cfg.seq, cfg.batch, cfg.steps, cfg.data_seed)
    ids = data.ids.to(device)
    offsets = offsets.to(device)
    cuda = torch.device(device).type == "cuda"
    steps = range(cfg.steps)
    bar = None
    if progress:
        try:
            from tqdm import tqdm
        except ImportError:   # tqdm is in requirements.txt; without it, no progress bar
            tqdm = None
        if tqdm is not None:
            bar = tqdm(steps, desc="train", unit="step", leave=False, file=sys.stderr)
            steps = bar
    for step in steps:
        x, y = get_batch(ids, offsets[step], cfg.seq)
        order = runs if step % 2 == 0 else runs[::-1]
        for run in order:
            for group in run.optimizer.param_groups:
                group["lr"] = _lr_at(step, cfg)
            if cuda:
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record()
            else:
                t0 = time.perf_counter()
            out = logits(run.model, x)
            loss = F.cross_entropy(out.float().flatten(0, 1), y.flatten())
            loss.backward()
            run.optimizer.step()            # clip, AdamW, clear the gradients
            if cuda:
                end.record()
                run.times.append((start, end))
            else:
                run.times.append(time.perf_counter() - t0)
            run.losses.append(loss.detach())
        if bar is not None and (step % 10 == 0 or step == cfg.steps - 1):
            bar.set_postfix({r.name: f"{r.losses[-1].item():.3f}" for r in runs})
    if cuda:
        torch.cuda.synchronize()


def _losses(run: Run) -> list[float]:
    return torch.stack(run.losses).float().tolist() if run.losses else []


def _step_ms(run: Run, warmup: int) -> float:
    times = run.times[warmup:] or run.times
    if not times:
        return math.nan
    if isinstance(times[0], tuple):
        return statistics.median(start.elapsed_time(end) for start, end in times)
    return statistics.median(t * 1e3 for t in times)


@dataclass
class Result:
    model: str
    dtype: str
    config: dict
    losses: list[float]
    losses_sdpa: list[float]
    step_ms: float
    step_ms_sdpa: float
    expected_calls: int             # attention layers x steps (0 where our kernels cannot run)
    kernel_forward_calls: int
    kernel_backward_calls: int
    hf_fallbacks: dict[str, int] = field(default_factory=dict)
    losses_other_seed: list[float] = field(default_factory=list)

    @property
    def last(self) -> int:
        return self.config["last"]

    @property
    def loss_gap(self) -> float:
        return loss_gap(self.losses, self.losses_sdpa, self.last)

    @property
    def seed_gap(self) -> float:
        if not self.losses_other_seed:
            return math.nan
        return loss_gap(self.losses_other_seed, self.losses_sdpa, self.last)

    @property
    def fallbacks(self) -> int:
        """Attention calls, forward or backward, that did not run on our kernels: those missing
        from the kernel counts (a call transformers sent to its fallback is missing there too,
        forward and backward); where no kernel can run (a CPU), transformers' fallback count."""
        if self.expected_calls == 0:
            return sum(self.hf_fallbacks.values())
        return (max(self.expected_calls - self.kernel_forward_calls, 0)
                + max(self.expected_calls - self.kernel_backward_calls, 0))

    def final(self, losses: list[float]) -> float:
        return statistics.fmean(losses[-self.last:])

    def fields(self) -> dict[str, float]:
        """TRAIN_FIELDS of task6/manifest.py."""
        return {"final_loss": self.final(self.losses),
                "final_loss_sdpa": self.final(self.losses_sdpa),
                "loss_gap": self.loss_gap,
                "step_ms": self.step_ms, "step_ms_sdpa": self.step_ms_sdpa,
                "step_time_ratio_vs_sdpa": self.step_ms_sdpa / self.step_ms,
                "fallbacks": float(self.fallbacks)}

    def checks(self) -> list[tuple[str, bool, str]]:
        """(name, passed, detail) of every check of this run."""
        out = []
        finite = all(math.isfinite(v) for v in self.losses + self.losses_sdpa)
        out.append(("losses finite", finite, "every loss of both runs is finite"))
        first = statistics.fmean(self.losses_sdpa[:self.last])
        fell = finite and self.final(self.losses) < first and self.final(self.losses_sdpa) < first
        out.append(("loss fell", fell, f"mean of the last {self.last} below the first {self.last} "
                                       f"(SDPA's first: {first:.4f})"))
        gap = self.loss_gap
        out.append(("loss gap", math.isfinite(gap) and gap <= TRAIN_GAP_TARGET,
                    f"{gap:.3f} (target <= {TRAIN_GAP_TARGET:g})"))
        detail = (f"kernel forward {self.kernel_forward_calls}, backward "
                  f"{self.kernel_backward_calls} of {self.expected_calls} each")
        if self.hf_fallbacks:
            detail += f"; transformers fallbacks {self.hf_fallbacks}"
        out.append(("0 fallbacks", self.fallbacks == 0 and not self.hf_fallbacks, detail))
        return out

    @property
    def passed(self) -> bool:
        return all(ok for _, ok, _ in self.checks())


class Optimizer:
    """AdamW with gradient clipping. Weights in fp16/bf16 get fp32 master copies that AdamW
    updates (its moments in fp32 too: fp16 moments underflow, and a zero second moment turns
    the update into m / eps), copied back into the model after every step: the usual
    mixed-precision recipe, without loss scaling at these loss magnitudes."""

    def __init__(self, model: torch.nn.Module, cfg: TrainConfig):
        self.params = [p for p in model.parameters() if p.requires_grad]
        self.master = ([p.detach().float().clone() for p in self.params]
                       if any(p.dtype != torch.float32 for p in self.params) else None)
        self.clip = cfg.clip
        self.adam = torch.optim.AdamW(self.master or self.params, lr=cfg.lr, betas=(0.9, 0.95),
                                      weight_decay=0.0)

    @property
    def param_groups(self):
        return self.adam.param_groups

    @torch.no_grad()
    def step(self) -> None:
        if self.master is not None:
            for m, p in zip(self.master, self.params, strict=True):
                m.grad = None if p.grad is None else p.grad.float()
        trained = self.master or self.params
        if self.clip > 0:
            torch.nn.utils.clip_grad_norm_(trained, self.clip)
        self.adam.step()
        if self.master is not None:
            for m, p in zip(self.master, self.params, strict=True):
                p.copy_(m)
        for t in self.params + (self.master or []):
            t.grad = None


def _optimizer(model: torch.nn.Module, cfg: TrainConfig) -> Optimizer:
    return Optimizer(model, cfg)


def train_model(name: str, cfg: TrainConfig, data: CharData, device, *, seed_noise: bool = False,
                ours_attention: str | None = None, progress: bool = True) -> Result:
    """Train `name` ("task6" or "gpt2") on our kernels and on SDPA side by side; the result.
    ours_attention: None for our kernels; "torch" (task6) or "sdpa" (gpt2) runs ours on PyTorch
    too (the CPU tests check the loop that way)."""
    cfg.check()
    device = torch.device(device)
    kwargs = {} if ours_attention is None else {"ours_attention": ours_attention}
    pair = PAIRS[name](cfg, data.vocab_size, device, **kwargs)
    runs = [Run("ours", pair.ours, _optimizer(pair.ours, cfg)),
            Run("sdpa", pair.sdpa, _optimizer(pair.sdpa, cfg))]
    if seed_noise and pair.other_seed is not None:
        other = pair.other_seed(cfg.seed + 1)
        runs.append(Run("sdpa_seed2", other, _optimizer(other, cfg)))

    from task7 import hf_attention

    hf_attention.reset_counters()
    with count_kernel_calls() as calls:
        train_runs(runs, pair.logits, data, cfg, device, progress=progress)
    on_kernels = device.type == "cuda" and ours_attention is None
    return Result(name, cfg.dtype, asdict(cfg), _losses(runs[0]), _losses(runs[1]),
                  _step_ms(runs[0], cfg.timing_warmup), _step_ms(runs[1], cfg.timing_warmup),
                  pair.attention_layers * cfg.steps if on_kernels else 0,
                  calls.forward, calls.backward,
                  hf_fallbacks=hf_attention.fallback_counts() if name == "gpt2" else {},
                  losses_other_seed=_losses(runs[2]) if len(runs) > 2 else [])


# --- results, curves and the plot -------------------------------------------------------------

def metrics_of(result: Result) -> dict[str, float]:
    """results/<gpu>.json figures of one run (task6/manifest.py names them)."""
    fields = result.fields()
    out = {train_metric(result.model, result.dtype, k): v for k, v in fields.items()}
    if not math.isnan(result.seed_gap):
        out[train_metric(result.model, result.dtype, "seed_gap")] = result.seed_gap
    if result.dtype == TRAIN_HEADLINE_DTYPE:
        out.update(train_headline_metrics(result.model, fields))
    return out


def curves_path(key: str | None = None) -> Path:
    from common.results import RESULTS_DIR, device_key

    return RESULTS_DIR / f"train_{key or device_key()}_curves.json"


def plot_path(key: str | None = None) -> Path:
    from common.results import RESULTS_DIR, device_key

    return RESULTS_DIR / f"train_{key or device_key()}.png"


def save_curves(results: list[Result], path: Path) -> Path:
    """Merge these runs' curves into `path` (one entry per model and dtype, the latest wins)."""
    from common.results import run_meta

    data = json.loads(path.read_text()) if path.exists() else {"runs": {}}
    for r in results:
        data["runs"][f"{r.model}.{r.dtype}"] = {
            "model": r.model, "dtype": r.dtype, "config": r.config, "meta": run_meta(),
            "ours": r.losses, "sdpa": r.losses_sdpa, "sdpa_other_seed": r.losses_other_seed,
            "loss_gap": r.loss_gap, "step_ms": r.step_ms, "step_ms_sdpa": r.step_ms_sdpa}
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=1, sort_keys=True) + "\n")
    return path


def plot_curves(curves: Path, out: Path, window: int = 20) -> Path:
    """Both loss curves of every saved run (one column each), and ours - SDPA below them."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    runs = json.loads(curves.read_text())["runs"]
    if not runs:
        raise ValueError(f"{curves} holds no training runs; run python -m task6.train first.")
    names = sorted(runs)
    fig, axes = plt.subplots(2, len(names), figsize=(5.5 * len(names), 6.5), squeeze=False,
                             gridspec_kw={"height_ratios": (3, 1.4)}, sharex="col")
    for col, name in enumerate(names):
        r = runs[name]
        top, bottom = axes[0][col], axes[1][col]
        steps = range(1, len(r["ours"]) + 1)
        for key, label, color in (("sdpa", "SDPA", "tab:blue"), ("ours", "ours", "tab:red"),
                                  ("sdpa_other_seed", "SDPA, other init seed", "tab:gray")):
            if not r.get(key):
                continue
            top.plot(steps, r[key], color=color, alpha=0.25, linewidth=0.8)
            top.plot(steps, smooth(r[key], window), color=color, linewidth=1.6,
                     label=f"{label} ({window}-step mean)")
        last = r["config"]["last"]
        top.axvspan(len(r["ours"]) - last + 0.5, len(r["ours"]) + 0.5, color="0.9", zorder=0,
                    label=f"last {last}: gap {r['loss_gap']:.2f} (target <= {TRAIN_GAP_TARGET:g})")
        top.set_title(f"{r['model']}, {r['dtype']}: step {r['step_ms']:.2f} ms ours, "
                      f"{r['step_ms_sdpa']:.2f} ms SDPA", fontsize=9)
        top.set_ylabel("training loss (nats / char)")
        top.grid(alpha=0.3)
        top.legend(fontsize=7)
        bottom.plot(steps, [a - b for a, b in zip(r["ours"], r["sdpa"], strict=True)],
                    color="black", linewidth=0.8)
        bottom.axhline(0.0, color="0.6", linewidth=0.8)
        bottom.set_xlabel("step")
        bottom.set_ylabel("ours - SDPA")
        bottom.grid(alpha=0.3)
    meta = next(iter(runs.values()))["meta"]
    fig.suptitle(f"Training on our kernels vs SDPA, same weights and batches "
                 f"({meta.get('device', '?')}, torch {meta.get('torch', '?')})", fontsize=10)
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=90)
    plt.close(fig)
    return out


# --- the command ------------------------------------------------------------------------------

def build_parser() -> argparse.ArgumentParser:
    d = TrainConfig()
    p = argparse.ArgumentParser(prog="python -m task6.train", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="all", choices=TRAIN_MODELS + ("all",))
    p.add_argument("--dtype", default=DEFAULT_DTYPE, choices=tuple(DTYPES),
                   help="weights and activations (default %(default)s: the lesson backward)")
    p.add_argument("--steps", type=int, default=d.steps)
    p.add_argument("--batch", type=int, default=d.batch)
    p.add_argument("--seq", type=int, default=d.seq, help="characters per training window")
    p.add_argument("--hidden", type=int, default=d.hidden)
    p.add_argument("--heads", type=int, default=d.heads, help="head_dim = hidden / heads")
    p.add_argument("--layers", type=int, default=d.layers)
    p.add_argument("--lr", type=float, default=d.lr, help="AdamW's peak learning rate")
    p.add_argument("--lr-warmup", type=int, default=d.lr_warmup)
    p.add_argument("--seed", type=int, default=d.seed, help="seed of the initial weights")
    p.add_argument("--data-seed", type=int, default=d.data_seed, help="seed of the batch order")
    p.add_argument("--last", type=int, default=d.last, help="losses the loss gap compares")
    p.add_argument("--timing-warmup", type=int, default=d.timing_warmup,
                   help="steps left out of the step-time median")
    p.add_argument("--seed-noise", action="store_true",
                   help="a third run: SDPA from weights of another seed (the gap a seed makes)")
    p.add_argument("--text", type=Path, default=DATA_PATH, help="the training text (UTF-8)")
    p.add_argument("--device", default="cuda")
    p.add_argument("--no-record", action="store_true", help="write nothing to results/")
    p.add_argument("--no-plot", action="store_true", help="save the curves, draw no plot")
    p.add_argument("--plot-only", action="store_true",
                   help="train nothing: draw results/train_<gpu>.png from the saved curves")
    p.add_argument("--results-key", default=None,
                   help="the <gpu> of the file names (default: this machine's GPU)")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    return p


def config_from(args: argparse.Namespace) -> TrainConfig:
    return TrainConfig(steps=args.steps, batch=args.batch, seq=args.seq, hidden=args.hidden,
                       heads=args.heads, layers=args.layers, lr=args.lr,
                       lr_warmup=args.lr_warmup, seed=args.seed, data_seed=args.data_seed,
                       last=args.last, timing_warmup=args.timing_warmup, dtype=args.dtype)


def report_lines(result: Result) -> list[str]:
    f = result.fields()
    lines = [f"[{result.model} {result.dtype}] final loss (mean of the last {result.last}): "
             f"ours {f['final_loss']:.4f}, SDPA {f['final_loss_sdpa']:.4f}; loss gap "
             f"{f['loss_gap']:.3f}",
             f"[{result.model} {result.dtype}] step time (median after {result.config['timing_warmup']}"
             f" steps): ours {f['step_ms']:.3f} ms, SDPA {f['step_ms_sdpa']:.3f} ms, SDPA / ours "
             f"{f['step_time_ratio_vs_sdpa']:.2f}x"]
    diffs = [abs(a - b) for a, b in zip(result.losses, result.losses_sdpa, strict=True)]
    if diffs:
        early = min(10, len(diffs))
        lines.append(f"[{result.model} {result.dtype}] |ours - SDPA| per step (informative): "
                     f"largest {max(diffs[:early]):.2e} in the first {early} steps, "
                     f"{max(diffs):.2e} over all {len(diffs)}")
    if not math.isnan(result.seed_gap):
        lines.append(f"[{result.model} {result.dtype}] seed noise: SDPA from other weights is "
                     f"{result.seed_gap:.3f} SDPA standard deviations from SDPA (ours: "
                     f"{result.loss_gap:.3f})")
    for name, ok, detail in result.checks():
        lines.append(f"[{result.model} {result.dtype}] {'PASS' if ok else 'FAIL'} {name}: {detail}")
    return lines


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.plot_only:
        curves = curves_path(args.results_key)
        if not curves.exists():
            print(f"No saved curves at {curves}; run python -m task6.train first.", file=sys.stderr)
            return 1
        print(f"[train] wrote {plot_curves(curves, plot_path(args.results_key))}")
        return 0
    cfg = config_from(args)
    try:
        cfg.check()
    except ValueError as err:
        print(f"Bad arguments: {err}", file=sys.stderr)
        return 2
    device = torch.device(args.device)
    if device.type != "cuda" or not torch.cuda.is_available():
        print("python -m task6.train compares our CUDA kernels with SDPA, so it needs an NVIDIA "
              "GPU and a CUDA build of torch; none is visible here (the CPU tests, "
              "tests/test_train.py, check the loop on PyTorch alone).", file=sys.stderr)
        return 1
    data = CharData.load(args.text)
    print(f"[train] {args.text.name}: {len(data.ids)} characters, vocab {data.vocab_size}; "
          f"{cfg.steps} steps of {cfg.batch} x {cfg.seq}, hidden {cfg.hidden}, {cfg.heads} heads, "
          f"{cfg.layers} layers, {cfg.dtype}")
    models = TRAIN_MODELS if args.model == "all" else (args.model,)
    results = []
    from common.build import BuildError

    for name in models:
        try:
            result = train_model(name, cfg, data, device, seed_noise=args.seed_noise,
                                 progress=not args.quiet)
        except (NotImplementedError, BuildError) as err:
            # The student release before the backward lesson is written, or no working build.
            print(f"[train] {name}: {str(err).splitlines()[0]}", file=sys.stderr)
            return 1
        results.append(result)
        print("\n".join(report_lines(result)), flush=True)
    if not args.no_record:
        from common.results import record, results_path

        metrics = {k: v for r in results for k, v in metrics_of(r).items()}
        path = record(metrics, path=results_path(args.results_key))
        curves = save_curves(results, curves_path(args.results_key))
        print(f"[train] recorded {len(metrics)} figures in {path}; curves in {curves}")
        if not args.no_plot:
            print(f"[train] wrote {plot_curves(curves, plot_path(args.results_key))}")
    failed = [r for r in results if not r.passed]
    print(f"[train] {'every check passed' if not failed else 'FAILED: ' + ', '.join(r.model for r in failed)}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
