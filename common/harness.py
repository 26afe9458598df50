"""The course test protocol, shared by every task's test.py and by pytest.

`module_checks` runs one attention module the way the course grades it (seeded
nn.MultiheadAttention weights, the same input to both, allclose atol 1e-6) and adds what the
course lacked: a float64 reference with a fresh random input each run, and honest timing.
`task_main` is the body of every `python -m taskN.test`: parse flags, run the chosen check
groups, print the PASS/FAIL report, record the measured figures, exit 0 or 1.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

from common.checks import Check, check_allclose, check_relative, correctness_passed, report
from common.manifest import module_metric
from common.mha import make_mha, mha_forward, mha_weights, reference_module_output
from common.timing import time_any


def pick_device(requested: str | None = None) -> torch.device:
    if requested:
        return torch.device(requested)
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def device_problem(requested: str | None, gpu_only: bool = False) -> str | None:
    """None if `requested` (a --device value; None = the default) can run here, else one
    sentence saying why not: every `python -m taskN.test --device ...` checks this first, so
    asking for a GPU that is not there is one line, not a torch traceback. With `gpu_only` (a
    test whose every check runs CUDA code), a run that would land on the CPU is refused too."""
    if not requested:
        if gpu_only and not torch.cuda.is_available():
            return (f"This test needs an NVIDIA GPU, but {_no_gpu_reason()}; run it on a "
                    "machine with an NVIDIA GPU and a CUDA build of torch (see README.md, Setup).")
        return None
    try:
        device = torch.device(requested)
    except (RuntimeError, ValueError):
        return f"--device {requested!r} is not a device torch knows; use cuda or cpu."
    if device.type == "cuda":
        if not torch.cuda.is_available():
            return (f"--device {requested} asks for an NVIDIA GPU, but {_no_gpu_reason()}; run "
                    "it on a GPU machine, or with --device cpu where the task runs on a CPU.")
        if device.index is not None and device.index >= torch.cuda.device_count():
            return (f"--device {requested} asks for GPU {device.index}, but torch sees "
                    f"{torch.cuda.device_count()} GPU(s).")
    elif device.type == "cpu":
        if gpu_only:
            return (f"--device {requested}: this test's checks run CUDA code, so it needs an "
                    "NVIDIA GPU; leave --device out on a GPU machine.")
    else:
        return f"--device {requested} is not supported here; use cuda or cpu."
    return None


def _no_gpu_reason() -> str:
    """Why torch sees no GPU here, as the end of a sentence."""
    if torch.version.cuda is None:
        return f"this PyTorch ({torch.__version__}) is a CPU-only build"
    return "no CUDA GPU is visible to torch"


def gpu_group(group: str, args) -> tuple[torch.device | None, torch.Generator | None, list[Check]]:
    """The start of a group of GPU checks: (the CUDA device, a fresh generator (its seed
    printed; --seed reproduces), []), or (None, None, [one failing check]) when the run is
    on a CPU, so that the group reports instead of raising."""
    device = pick_device(getattr(args, "device", None))
    if device.type != "cuda":
        return None, None, [Check(group, False, "needs a CUDA GPU; none is in use here")]
    gen, seed = fresh_generator(getattr(args, "seed", None), device)
    # Printed so that a check that fails on one draw can be replayed with that draw.
    print(f"[{group}] inputs seed {seed} (pass --{group} --seed {seed} to reproduce)")
    return device, gen, []


@contextlib.contextmanager
def env_setting(name: str, value: str | None):
    """Set environment variable `name` to `value` inside the block, then restore it; None
    leaves it alone (the kernels' tile-config knobs are read on every call, so a test can time
    each config in one process without a rebuild)."""
    if value is None:
        yield
        return
    previous = os.environ.get(name)
    os.environ[name] = value
    try:
        yield
    finally:
        if previous is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = previous


def config_list(allowed) -> Callable[[str], list[int]]:
    """An argparse type for `--configs 0,1,2`: a non-empty list of integers among `allowed`."""
    def parse(text: str) -> list[int]:
        try:
            configs = [int(part) for part in text.split(",") if part.strip()]
        except ValueError as err:
            raise argparse.ArgumentTypeError(
                f"--configs takes comma-separated integers, not {text!r}") from err
        bad = [c for c in configs if c not in allowed]
        if bad or not configs:
            raise argparse.ArgumentTypeError(
                f"--configs: {bad or text!r} not among the tile configs {list(allowed)}")
        return configs

    return parse


def fresh_generator(seed: int | None, device) -> tuple[torch.Generator, int]:
    """A generator for the test's inputs: fresh each run unless a seed is given to reproduce."""
    seed = secrets.randbits(31) if seed is None else seed
    gen = torch.Generator(device=device)
    gen.manual_seed(seed)
    return gen, seed


@dataclass
class ModuleCase:
    batch: int
    seq: int
    causal: bool

    @property
    def label(self) -> str:
        return f"b{self.batch}_s{self.seq}"

    @property
    def mask(self) -> str:
        return "causal" if self.causal else "noncausal"


def module_checks(task: str, make_module: Callable, *, hidden: int, heads: int,
                  cases: list[ModuleCase], weight_seed: int, input_seed: int | None = None,
                  device: torch.device, fp64_max_batch: int = 4, course_allclose: bool = True,
                  timing: bool = False, timing_repeats: int = 10,
                  timing_max_seconds: float = 5.0) -> tuple[list[Check], dict]:
    """Check `make_module(w_q, w_k, w_v, w_o, hidden, heads)` against nn.MultiheadAttention.

    For each case: the course check (allclose atol 1e-6 against nn.MultiheadAttention with
    weights seeded by `weight_seed`), then the relative error against the float64 module on
    the first `fp64_max_batch` sequences (float64 at full size would not fit), and, with
    `timing`, the speedup over nn.MultiheadAttention (median of CUDA-event timings: up to
    `timing_repeats` calls each, fewer (at least 3) once a contender has spent
    `timing_max_seconds` of GPU time, so a case whose calls take a second each (task 4's
    B 64, S 4096 in fp32) costs seconds, not a minute).
    Returns the checks and the metrics {module_metric(task, "speedup", mask, label): x, ...}
    (task4/manifest.py names the ones it grades and shows).
    """
    checks: list[Check] = []
    metrics: dict[str, float] = {}
    gen, seed = fresh_generator(input_seed, device)
    mha = make_mha(hidden, heads, device=device, seed=weight_seed)
    weights = mha_weights(mha)
    module = make_module(*weights, hidden, heads)
    print(f"[{task}] hidden {hidden}, {heads} heads, weights seed {weight_seed}, "
          f"inputs seed {seed} (pass --seed {seed} to reproduce), device {device}")
    for case in cases:
        name = f"{case.mask} (B,S)=({case.batch},{case.seq})"
        x = torch.randn(case.batch, case.seq, hidden, device=device, generator=gen)
        with torch.no_grad():
            expected = mha_forward(mha, x, case.causal)
            try:
                out = module(x, causal=case.causal)
            except NotImplementedError as err:
                checks.append(Check(name, False, f"not implemented: {err}"))
                continue
            if course_allclose:
                checks.append(check_allclose(f"{name} vs nn.MultiheadAttention", out, expected))
            nb = min(case.batch, fp64_max_batch)
            truth = reference_module_output(x[:nb], weights, heads, case.causal)
            checks.append(check_relative(f"{name} vs float64", out[:nb], truth, x.dtype))
            if timing:
                budget = dict(repeats=timing_repeats, warmup=2, max_seconds=timing_max_seconds)
                t_ref = time_any(lambda x=x, c=case.causal: mha_forward(mha, x, c), device,
                                 **budget)
                t_ours = time_any(lambda x=x, c=case.causal: module(x, causal=c), device,
                                  **budget)
                speedup = t_ref.median_ms / t_ours.median_ms
                metrics[module_metric(task, "speedup", case.mask, case.label)] = speedup
                metrics[module_metric(task, "module_ms", case.mask, case.label)] = t_ours.median_ms
                metrics[module_metric(task, "mha_ms", case.mask, case.label)] = t_ref.median_ms
                checks.append(Check(f"{name} timing", True,
                                    f"ours {t_ours.median_ms:.3f} ms, nn.MultiheadAttention "
                                    f"{t_ref.median_ms:.3f} ms, speedup {speedup:.2f}x"))
        del x, expected, out
    return checks, metrics


def task_main(task: str, groups: dict[str, Callable[[argparse.Namespace], tuple[list[Check], dict]]],
              argv=None, description: str = "", extra_args: Callable | None = None,
              gpu_only: bool = False) -> int:
    """Run the chosen groups (`--<group>` flags, several allowed; none = all), report, record.

    Each group is `fn(args) -> (checks, metrics)`. Metrics are appended to
    results/<gpu>.json when the run is on a GPU and every correctness check passed (a
    missed performance target is recorded as measured; use --no-record to skip); a run
    with a wrong result never overwrites good numbers. `gpu_only`: every group runs CUDA
    code (tasks 2, 4, 5, 6), so without a GPU the test says so in one sentence and exits 1
    instead of failing each group (its --json report holds one failed check, "device").
    """
    from common.build import BuildError

    parser = argparse.ArgumentParser(prog=f"python -m {task}.test", description=description,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    for g in groups:
        parser.add_argument(f"--{g}", action="store_true", help=f"run the {g} checks")
    parser.add_argument("--seed", type=int, default=None,
                        help="seed for the random inputs (default: fresh each run)")
    parser.add_argument("--device", default=None, help="cuda or cpu (default: cuda if present)")
    parser.add_argument("--no-record", action="store_true",
                        help="do not append the measured figures to results/<gpu>.json")
    parser.add_argument("--skip", default="", metavar="GROUPS",
                        help="comma-separated groups to leave out of a run of every group")
    parser.add_argument("--json", type=Path, default=None,
                        help="also write the checks and figures to this JSON file (the grader reads it)")
    if extra_args:
        extra_args(parser)
    args = parser.parse_args(argv)
    skipped = {g for g in args.skip.split(",") if g}
    unknown = skipped - set(groups)
    if unknown:
        parser.error(f"--skip names groups {task} does not have: {', '.join(sorted(unknown))} "
                     f"(its groups: {', '.join(groups)})")
    chosen = ([g for g in groups if getattr(args, g.replace("-", "_"))]
              or [g for g in groups if g not in skipped])
    problem = device_problem(args.device, gpu_only)
    if problem:
        print(f"[{task}] {problem}")
        if args.json:
            args.json.write_text(json.dumps({
                "task": task, "groups": chosen, "exit_code": 1, "metrics": {}, "texts": {},
                "checks": [{"name": "device", "passed": False, "detail": problem, "target": False}],
            }, indent=1) + "\n")
        return 1

    all_checks: list[Check] = []
    metrics: dict[str, float] = {}
    texts: dict[str, str] = {}
    seconds: dict[str, float] = {}   # each group's wall time, printed after the report
    for g in chosen:
        started = time.perf_counter()
        try:
            result = groups[g](args)
        except BuildError as err:
            print(f"[{task}] {err}")
            all_checks.append(Check(g, False, "the extension did not build (see above)"))
            continue
        except NotImplementedError as err:
            # The student skeleton: a missing solution is a failed check, not a crash.
            all_checks.append(Check(g, False, f"not implemented: {err}"))
            continue
        finally:
            seconds[g] = time.perf_counter() - started
        checks, found = result[0], result[1]
        all_checks += checks
        metrics.update(found)
        if len(result) > 2:
            texts.update(result[2])
    code = report(f"{task}: {', '.join(chosen)}", all_checks)
    if len(seconds) > 1:
        print(f"[{task}] seconds per group: "
              + ", ".join(f"{g} {t:.1f}" for g, t in seconds.items()))
    if args.json:
        args.json.write_text(json.dumps({
            "task": task, "groups": chosen, "exit_code": code, "metrics": metrics, "texts": texts,
            "group_seconds": seconds,
            "checks": [{"name": c.name, "passed": c.passed, "detail": c.detail, "target": c.target}
                       for c in all_checks],
        }, indent=1) + "\n")
    device = pick_device(args.device)
    if (metrics or texts) and device.type == "cuda" and not args.no_record \
            and correctness_passed(all_checks):
        from common.results import record

        path = record(metrics, texts)
        print(f"[{task}] recorded {len(metrics) + len(texts)} figures in {path}")
    return code
