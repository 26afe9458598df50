"""Bad arguments through every kernel path: each raises the same sentence on every path.

    python -m task4.test --arguments

`flash_attention`, `task5.attention.decode_attention_grouped` and `task5.attention.attention`
check every argument once, before they choose a kernel (common.inputs.
check_attention_arguments). This group holds them to it: each bad call below is made on
every path its dtype can take (fp32: the course kernel, the strided classes, the grouped
decode; fp16/bf16: the mma.sync kernel, the Hopper kernel on an H100/H200, the strided
classes, the tensor-core and the CUDA-core decode), with the path forced, and must raise
ValueError or TypeError whose sentence names the argument (softcap, sinks and scale on the
prefill paths only: the decode entries do not take them yet). First the same call without the
mistake must run on that path (the Hopper path is also asked whether it takes it), so that
each raise is the mistake's and not the inputs'. A path that skipped a check would either
run (no exception: FAIL) or fail somewhere else (the wrong exception: FAIL).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable

import torch

from common.checks import Check, check_raises
from common.harness import gpu_group
from common.inputs import check_attention_arguments

DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}
BATCH, HEADS_Q, HEADS_KV, SEQ, HEAD_DIM = 2, 8, 2, 256, 128


def bad_calls(q, k, v, device) -> list[tuple[str, Callable[[dict], dict], str]]:
    """(name, edit of the call's keyword arguments, a word the sentence must contain)."""
    seq_k = k.shape[2]

    def with_(**changes):
        return lambda call: {**call, **changes}

    def tensor(name, fn):
        return lambda call: {**call, name: fn(call[name])}

    return [
        ("left_padding without key_lengths", with_(left_padding=True), "left_padding"),
        ("left_padding not a bool", with_(left_padding="yes"), "left_padding"),
        ("causal a string", with_(causal="yes"), "causal"),
        ("causal None", with_(causal=None), "causal"),
        ("window 2.5", with_(window=2.5), "window"),
        ("window 0", with_(window=0), "window"),
        ("stride 0", with_(stride=0), "stride"),
        ("stride a string", with_(stride="2"), "stride"),
        ("key_lengths a list", with_(key_lengths=[seq_k, 1]), "key_lengths"),
        ("key_lengths int64",
         with_(key_lengths=torch.full((BATCH,), seq_k, dtype=torch.int64, device=device)), "int32"),
        ("key_lengths beyond S_k",
         with_(key_lengths=torch.tensor([seq_k + 1, 1], dtype=torch.int32, device=device)),
         "key_lengths"),
        ("key_lengths of the wrong shape",
         with_(key_lengths=torch.ones(BATCH + 1, dtype=torch.int32, device=device)), "shape"),
        ("key_lengths on the CPU", with_(key_lengths=torch.ones(BATCH, dtype=torch.int32)), "cpu"),
        ("mask of dtype int64",
         with_(mask=torch.ones(q.shape[2], seq_k, dtype=torch.int64, device=device)), "dtype"),
        ("mask of the wrong shape",
         with_(mask=torch.ones(q.shape[2] + 1, seq_k, dtype=torch.bool, device=device)),
         "broadcast"),
        ("mask a list", with_(mask=[[True]]), "mask"),
        ("out of the wrong shape", with_(out=torch.empty(1, device=device, dtype=q.dtype)), "shape"),
        ("out a string", with_(out="out"), "out"),
        ("q of dtype float64", tensor("q", lambda t: t.double()), "dtype"),
        ("q on the CPU", tensor("q", lambda t: t.cpu()), "cuda"),
        ("q with 3 dimensions", tensor("q", lambda t: t[0]), "dimensions"),
        ("q a list", with_(q=[1.0]), "tensor"),
        ("k and v with 3 heads", lambda call: {**call, "k": call["k"][:, :1].expand(-1, 3, -1, -1),
                                               "v": call["v"][:, :1].expand(-1, 3, -1, -1)},
         "multiple"),
        ("head_dim 12", lambda call: {**call, **{n: call[n][..., :12] for n in "qkv"}}, "head_dim"),
        ("q's last dimension strided", tensor("q", lambda t: torch.stack((t, t), -1)[..., 0]),
         "contiguous"),
        ("q empty", tensor("q", lambda t: t[:, :, :0]), "empty"),
        ("k of another dtype", tensor("k", lambda t: t.to(torch.float16 if t.dtype != torch.float16
                                                          else torch.float32)), "dtype"),
    ]


def score_bad_calls(q, device) -> list[tuple[str, Callable[[dict], dict], str]]:
    """Bad softcap, sinks and scale (the prefill entries take them; the decode entries do not
    yet, so the group makes these calls on the prefill paths only)."""
    heads = q.shape[1]

    def with_(**changes):
        return lambda call: {**call, **changes}

    return [
        ("softcap 0", with_(softcap=0.0), "softcap"),
        ("softcap negative", with_(softcap=-30.0), "softcap"),
        ("softcap inf", with_(softcap=float("inf")), "softcap"),
        ("softcap NaN", with_(softcap=float("nan")), "softcap"),
        ("softcap a string", with_(softcap="50"), "softcap"),
        ("softcap True", with_(softcap=True), "softcap"),
        ("scale 0", with_(scale=0.0), "scale"),
        ("scale negative", with_(scale=-0.125), "scale"),
        ("scale inf", with_(scale=float("inf")), "scale"),
        ("scale a tensor", with_(scale=torch.tensor(0.125)), "scale"),
        ("sinks a list", with_(sinks=[0.0] * heads), "sinks"),
        ("sinks of dtype int64",
         with_(sinks=torch.zeros(heads, dtype=torch.int64, device=device)), "dtype"),
        ("sinks of the wrong shape", with_(sinks=torch.zeros(heads + 1, device=device)), "shape"),
        ("sinks [1, H_q]", with_(sinks=torch.zeros(1, heads, device=device)), "shape"),
        ("sinks on the CPU", with_(sinks=torch.zeros(heads)), "cpu"),
    ]


@contextlib.contextmanager
def _setting(module, name: str, value):
    before = getattr(module, name)
    setattr(module, name, value)
    try:
        yield
    finally:
        setattr(module, name, before)


def paths(dtype: torch.dtype) -> list[tuple[str, Callable, Callable, bool]]:
    """(name, entry(q, k, v, **kwargs), a context that forces the path, decode?) for `dtype`."""
    from task4 import attention as prefill
    from task4 import hopper
    from task5 import attention as decode

    def forced(settings=None):
        settings = settings or {}

        def context():
            stack = contextlib.ExitStack()
            for (module, name), value in settings.items():
                stack.enter_context(_setting(module, name, value))
            return stack
        return context

    def prefill_entry(q, k, v, **kw):
        return prefill.flash_attention(q, k, v, kw.pop("causal"), kw.pop("out"), **kw)

    def decode_entry(q, k, v, **kw):
        return decode.decode_attention_grouped(q, k, v, **kw)

    def attention_entry(q, k, v, **kw):
        return decode.attention(q, k, v, **kw)

    dense = {(prefill, "STRIDE_AS_DENSE_CLASSES"): False}
    found = [("strided classes", prefill_entry, forced(), False),
             ("task5.attention.attention", attention_entry, forced(dense), False)]
    if dtype == torch.float32:
        found += [("fp32 course kernel", prefill_entry, forced(dense), False),
                  ("grouped decode (CUDA cores)", decode_entry,
                   forced({(decode, "TENSOR_CORE_DECODE"): False}), True)]
        return found
    found += [("mma.sync kernel", prefill_entry,
               forced({**dense, (prefill, "HOPPER_PREFILL"): False}), False),
              ("tensor-core decode", decode_entry,
               forced({(decode, "TENSOR_CORE_DECODE"): True}), True),
              ("tensor-core decode on task 4's kernel", decode_entry,
               forced({(decode, "TENSOR_CORE_DECODE"): True, (decode, "GQA_DECODE_KERNEL"): False}),
               True),
              ("grouped decode (CUDA cores)", decode_entry,
               forced({(decode, "TENSOR_CORE_DECODE"): False}), True)]
    if hopper.available():
        found.append(("Hopper kernel", prefill_entry,
                      forced({**dense, (prefill, "HOPPER_PREFILL"): True}), False))
    return found


def _inputs(dtype, device, gen, decode: bool):
    seq_q = 1 if decode else SEQ
    q = torch.randn(BATCH, HEADS_Q, seq_q, HEAD_DIM, device=device, generator=gen).to(dtype)
    k, v = (torch.randn(BATCH, HEADS_KV, SEQ, HEAD_DIM, device=device, generator=gen).to(dtype)
            for _ in range(2))
    return q, k, v


def _base_call(q, k, v, strided_classes: bool) -> dict:
    return dict(q=q, k=k, v=v, causal=True, out=None, window=None,
                stride=2 if strided_classes else 1, mask=None, key_lengths=None,
                left_padding=False)


def arguments_group(args=None):
    device, gen, failed = gpu_group("arguments", args)
    if failed:
        return failed, {}
    from task4 import attention as prefill

    checks = []
    for dname, dtype in DTYPES.items():
        for path, entry, context, decode in paths(dtype):
            q, k, v = _inputs(dtype, device, gen, decode)
            base = _base_call(q, k, v, strided_classes=path == "strided classes")

            def call(kwargs, entry=entry):
                kw = dict(kwargs)
                return entry(kw.pop("q"), kw.pop("k"), kw.pop("v"), **kw)

            with context():
                try:
                    call(base)
                    torch.cuda.synchronize()
                except Exception as err:  # the inputs themselves must be fine on this path
                    checks.append(Check(f"{dname} {path}: the call without a mistake", False,
                                        f"raised {type(err).__name__}: {err}"))
                    continue
                if path == "Hopper kernel" and prefill._hopper_version(
                        q, k, v, True, None) is None:
                    checks.append(Check(f"{dname} {path}: takes the call", False,
                                        "the Hopper kernel does not take the base inputs"))
                    continue
                calls = bad_calls(q, k, v, device) + ([] if decode else score_bad_calls(q, device))
                results = [check_raises(f"{dname} {path}: {name}", lambda e=edit: call(e(base)),
                                        exc_types=(ValueError, TypeError), must_mention=word)
                           for name, edit, word in calls]
            bad = [c for c in results if not c.passed]
            checks.append(Check(f"{dname} {path}: {len(results)} bad calls each raise a sentence "
                                "naming the argument", not bad,
                                "; ".join(c.line() for c in bad[:4])))
    return checks, {}


def cpu_check_cases() -> list[Check]:
    """The same bad calls against check_attention_arguments itself on CPU tensors (what CI
    can run): each raises its sentence; the call without a mistake passes."""
    gen = torch.Generator().manual_seed(0)
    checks = []
    for dname, dtype in DTYPES.items():
        q, k, v = _inputs(dtype, "cpu", gen, decode=False)
        base = _base_call(q, k, v, strided_classes=False)

        def call(kwargs):
            kw = dict(kwargs)
            return check_attention_arguments(kw.pop("q"), kw.pop("k"), kw.pop("v"), kernel=False,
                                             **kw)

        call(base)
        for name, edit, word in bad_calls(q, k, v, "cpu") + score_bad_calls(q, "cpu"):
            if word in ("cuda", "cpu", "contiguous"):
                continue  # devices differ only on a GPU machine; kernel=False skips the layout
            checks.append(check_raises(f"{dname} {name}", lambda e=edit: call(e(base)),
                                       exc_types=(ValueError, TypeError), must_mention=word))
    return checks


GROUPS = {"arguments": arguments_group}
