"""task6/train.py (issue 33, "Train something"): the data, the loss-gap criterion, the loop, the
figures it records and the plot on a CPU; on a GPU, a short run of both models on our forward and
backward kernels against SDPA."""

from __future__ import annotations

import math
import random
import subprocess
import sys

import pytest
import torch

from common.results import REPO_ROOT
from task6 import manifest
from task6 import train as tr

TINY = dict(batch=2, seq=16, hidden=32, heads=2, layers=1, last=2, timing_warmup=1, lr_warmup=2)


def _noisy(n: int, level: float, noise: float, seed: int) -> list[float]:
    rng = random.Random(seed)
    return [level + 1.0 / (1 + 0.1 * i) + rng.gauss(0.0, noise) for i in range(n)]


def test_help_runs_without_a_gpu():
    proc = subprocess.run([sys.executable, "-m", "task6.train", "--help"], cwd=REPO_ROOT,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    for word in ("--dtype", "--steps", "--plot-only", "--seed-noise", "loss gap"):
        assert word in proc.stdout


def test_the_text_loads_as_characters():
    data = tr.CharData.load()
    assert tr.DATA_PATH.stat().st_size <= 300_000        # "a small text": a few hundred KB at most
    assert data.text.isascii() and len(data.ids) == len(data.text) > 10_000
    assert data.vocab_size == len(set(data.text)) < 128
    assert data.ids.dtype == torch.long and int(data.ids.max()) < data.vocab_size
    assert data.decode(data.ids[:200]) == data.text[:200]
    with pytest.raises(FileNotFoundError, match="--text"):
        tr.CharData.load(REPO_ROOT / "no_such_text.txt")


def test_batches_are_seeded_next_character_windows():
    data = tr.CharData.from_text("abcdefghijklmnopqrstuvwxyz" * 4)
    offsets = tr.batch_offsets(len(data.ids), 8, 3, 5, seed=7)
    assert offsets.shape == (5, 3)
    assert torch.equal(offsets, tr.batch_offsets(len(data.ids), 8, 3, 5, seed=7))
    assert not torch.equal(offsets, tr.batch_offsets(len(data.ids), 8, 3, 5, seed=8))
    assert int(offsets.min()) >= 0 and int(offsets.max()) + 8 + 1 <= len(data.ids)
    x, y = tr.get_batch(data.ids, offsets[0], 8)
    assert x.shape == y.shape == (3, 8)
    assert torch.equal(x[:, 1:], y[:, :-1])              # y is x shifted by one character
    for row, start in enumerate(offsets[0].tolist()):
        assert data.decode(x[row]) == data.text[start:start + 8]
    with pytest.raises(ValueError, match="too few"):
        tr.batch_offsets(9, 8, 1, 1, seed=0)


def test_loss_gap_on_synthetic_curves():
    ref = _noisy(300, 1.5, 0.05, seed=1)
    # The same run again, up to rounding: far inside the noise.
    assert tr.loss_gap([v + 1e-6 for v in ref], ref) < 0.01
    assert tr.loss_gap(ref, ref) == 0.0
    # Another draw of the batch noise around the same curve: inside the band.
    assert tr.within_noise(_noisy(300, 1.5, 0.05, seed=2), ref)
    # A curve that ends two noise widths higher: outside.
    shifted = [v + 0.1 for v in ref]
    assert 1.5 < tr.loss_gap(shifted, ref) < 2.5 and not tr.within_noise(shifted, ref)
    # Only the last N count: a different start does not matter.
    early = [10.0] * 250 + ref[250:]
    assert tr.loss_gap(early, ref, last=50) == 0.0
    # A flat reference: any difference is infinitely many standard deviations.
    assert tr.loss_gap([1.0] * 60, [1.0] * 60) == 0.0
    assert tr.loss_gap([1.1] * 60, [1.0] * 60) == math.inf
    assert not tr.within_noise([1.1] * 60, [1.0] * 60)
    assert not tr.within_noise([math.nan] * 60, ref[:60])
    with pytest.raises(ValueError, match="last 50"):
        tr.loss_gap(ref[:10], ref, last=50)
    with pytest.raises(ValueError, match=">= 2"):
        tr.loss_gap(ref, ref, last=1)


def test_smooth_is_a_trailing_mean():
    assert tr.smooth([1.0, 3.0, 5.0, 7.0], 2) == [1.0, 2.0, 4.0, 6.0]
    assert tr.smooth([2.0] * 5, 10) == [2.0] * 5


def _result(model="task6", dtype="fp32", **kw) -> tr.Result:
    cfg = tr.TrainConfig(steps=60, last=10, dtype=dtype)
    base = dict(losses=_noisy(60, 1.0, 0.02, 3), losses_sdpa=_noisy(60, 1.0, 0.02, 3),
                step_ms=2.0, step_ms_sdpa=3.0, expected_calls=240, kernel_forward_calls=240,
                kernel_backward_calls=240)
    base.update(kw)
    return tr.Result(model, dtype, vars(cfg).copy(), **base)


def test_figures_and_checks_of_a_result():
    r = _result()
    assert r.passed and r.fallbacks == 0 and r.loss_gap == 0.0
    fields = r.fields()
    assert set(fields) == set(manifest.TRAIN_FIELDS)
    assert fields["step_time_ratio_vs_sdpa"] == 1.5
    names = tr.metrics_of(r)
    assert {manifest.train_metric("task6", "fp32", f) for f in manifest.TRAIN_FIELDS} <= set(names)
    assert names[manifest.TRAIN_LOSS_GAP] == 0.0 and names[manifest.TRAIN_STEP_RATIO] == 1.5
    # 3 calls sent to transformers' fallback: 3 forward and 3 backward calls not on our kernels.
    fell_back = _result("gpt2", hf_fallbacks={"dropout in training": 3},
                        kernel_forward_calls=237, kernel_backward_calls=237)
    gpt2 = tr.metrics_of(fell_back)
    assert gpt2[manifest.GPT2_TRAIN_FALLBACKS] == 6 and manifest.GPT2_TRAIN_LOSS_GAP in gpt2
    assert not fell_back.passed
    # The dtype-less names come from runs in the headline dtype only.
    bf16 = tr.metrics_of(_result(dtype="bf16"))
    assert manifest.TRAIN_LOSS_GAP not in bf16 and "task6.train.task6.bf16.loss_gap" in bf16
    # Missing kernel calls are fallbacks; so is a loss that ends outside the noise.
    short = _result(kernel_backward_calls=200)
    assert short.fallbacks == 40 and not short.passed
    assert not _result(losses=[v + 1.0 for v in _noisy(60, 1.0, 0.02, 3)]).passed
    assert not _result(losses=[math.nan] * 60).passed


def test_every_recorded_name_is_in_the_results_table():
    shown = {cell.name for block in manifest.TRAIN_SECTION.blocks for row in block.rows
             for cell in row.cells if hasattr(cell, "name")}
    for model in manifest.TRAIN_MODELS:
        for dtype in manifest.TRAIN_DTYPES:
            r = _result(model, dtype)
            per_run = {k for k in tr.metrics_of(r) if k.startswith("task6.train.")
                       and k.count(".") == 4}
            assert per_run <= shown, per_run - shown
    assert manifest.TRAIN_SECTION in manifest.MANIFEST.sections


def test_training_loop_on_the_cpu():
    """The loop on PyTorch alone (no kernels here): same weights and batches on both sides,
    so task 6's model gives the very same losses; GPT-2 on "course_kernels" runs every
    attention call on task 5's entry (its PyTorch twin on a CPU) with no fallback."""
    from task7 import hf_attention

    data = tr.CharData.load()
    cfg = tr.TrainConfig(steps=3, **TINY)
    r = tr.train_model("task6", cfg, data, "cpu", ours_attention="torch", progress=False)
    assert len(r.losses) == len(r.losses_sdpa) == 3 and r.losses == r.losses_sdpa
    assert r.expected_calls == 0 and r.step_ms > 0 and r.fallbacks == 0
    g = tr.train_model("gpt2", cfg, data, "cpu", progress=False)
    assert hf_attention.call_counts().get("structured") == cfg.layers * cfg.steps
    assert g.hf_fallbacks == {} and g.fallbacks == 0
    assert max(abs(a - b) for a, b in zip(g.losses, g.losses_sdpa, strict=True)) < 1e-4
    assert g.losses[-1] < g.losses[0]


def test_half_precision_weights_train_on_fp32_master_copies():
    """bf16 weights: AdamW updates fp32 copies (its moments in fp32), the model stays bf16."""
    data = tr.CharData.load()
    cfg = tr.TrainConfig(steps=3, dtype="bf16", **TINY)
    pair = tr.task6_pair(cfg, data.vocab_size, "cpu", ours_attention="torch")
    opt = tr.Optimizer(pair.ours, cfg)
    assert opt.master is not None and all(m.dtype == torch.float32 for m in opt.master)
    before = [p.detach().clone() for p in opt.params]
    x, y = tr.get_batch(data.ids, torch.tensor([0, 100]), cfg.seq)
    loss = torch.nn.functional.cross_entropy(pair.logits(pair.ours, x).float().flatten(0, 1),
                                             y.flatten())
    loss.backward()
    opt.step()
    assert all(p.grad is None and p.dtype == torch.bfloat16 for p in opt.params)
    assert all(torch.equal(p, m.to(torch.bfloat16)) for p, m in zip(opt.params, opt.master))
    assert any(not torch.equal(a, b) for a, b in zip(before, opt.params))
    assert tr.Optimizer(tr.task6_pair(tr.TrainConfig(**TINY), data.vocab_size, "cpu",
                                      ours_attention="torch").ours, cfg).master is None


def test_curves_and_plot(tmp_path):
    curves = tr.save_curves([_result(), _result("gpt2")], tmp_path / "train_x_curves.json")
    tr.save_curves([_result(dtype="bf16")], curves)                  # merged, not replaced
    import json

    assert sorted(json.loads(curves.read_text())["runs"]) == ["gpt2.fp32", "task6.bf16",
                                                              "task6.fp32"]
    out = tr.plot_curves(curves, tmp_path / "train_x.png")
    assert out.exists() and out.stat().st_size > 10_000


def test_main_refuses_bad_arguments_and_a_missing_gpu(capsys, tmp_path, monkeypatch):
    assert tr.main(["--last", "1", "--steps", "5"]) == 2
    assert "--last" in capsys.readouterr().err
    if not torch.cuda.is_available():
        assert tr.main(["--steps", "20", "--last", "2", "--no-record"]) == 1
        assert "needs an NVIDIA GPU" in capsys.readouterr().err
    monkeypatch.setattr(tr, "curves_path", lambda key=None: tmp_path / "none.json")
    assert tr.main(["--plot-only"]) == 1
    assert "No saved curves" in capsys.readouterr().err


@pytest.mark.gpu
@pytest.mark.slow
@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
def test_training_on_our_kernels_matches_sdpa(dtype):
    """30 steps of both models on our forward and backward kernels beside SDPA: every attention
    call of every step ran on our kernels (forward and backward), and the loss gap over the last
    10 steps is within SDPA's noise."""
    data = tr.CharData.load()
    cfg = tr.TrainConfig(steps=30, batch=8, seq=64, hidden=128, heads=2, layers=2, last=10,
                         timing_warmup=5, dtype=dtype)
    for model in tr.TRAIN_MODELS:
        r = tr.train_model(model, cfg, data, "cuda", progress=False)
        lines = "\n".join(tr.report_lines(r))
        assert r.expected_calls == cfg.layers * cfg.steps, lines
        assert r.kernel_forward_calls == r.kernel_backward_calls == r.expected_calls, lines
        assert r.fallbacks == 0, lines
        assert r.passed, lines
        assert math.isfinite(r.step_ms) and math.isfinite(r.step_ms_sdpa), lines
