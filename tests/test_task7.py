"""Task 7: GPT-2 on our kernels. CPU tests cover the offline model, the options, the loop and the
mask handling (with the PyTorch versions of the operations); GPU tests run the parity check."""

from __future__ import annotations

import argparse
import importlib

import pytest
import torch

from common.checks import assert_checks
from task7 import gpt2
from task7 import test as task7_test


@pytest.fixture
def offline(monkeypatch):
    """No hub: HF_HUB_OFFLINE=1 (task7 then never tries the network)."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")


@pytest.fixture
def tiny_random_gpt2(monkeypatch):
    """--random-weights builds the tiny GPT-2 of task7.test instead of the 124M one (speed)."""
    real = gpt2.build_random_gpt2

    def build(seed=gpt2.SEED, config=None):
        return real(seed, task7_test.tiny_config() if config is None else config)

    monkeypatch.setattr(gpt2, "build_random_gpt2", build)


@pytest.mark.parametrize("name", ["gpt2", "hf_attention", "models", "inference",
                                  "inference_ref", "compare", "test"])
def test_every_module_imports_without_a_gpu(name):
    importlib.import_module(f"task7.{name}")


def test_random_weights_are_gpt2_small_and_seeded():
    a, b = gpt2.build_random_gpt2(0), gpt2.build_random_gpt2(0)
    c = a.config
    assert (c.n_layer, c.n_head, c.n_embd, c.n_positions, c.vocab_size) == (12, 12, 768, 1024, 50257)
    assert not a.training
    state_a, state_b = a.state_dict(), b.state_dict()
    assert all(torch.equal(state_a[k], state_b[k]) for k in state_a), "same seed, different weights"
    other = gpt2.build_random_gpt2(1).transformer.h[0].attn.c_attn.weight
    assert not torch.equal(other, a.transformer.h[0].attn.c_attn.weight)


def test_conv1d_is_x_at_w_plus_b():
    """GPT-2's c_attn stores W as [in, out] (the transpose of nn.Linear): y = x @ W + b."""
    attn = gpt2.build_random_gpt2(0, task7_test.tiny_config()).transformer.h[0].attn
    x = torch.randn(3, 128)
    assert attn.c_attn.weight.shape == (128, 3 * 128)
    assert torch.allclose(attn.c_attn(x), x @ attn.c_attn.weight + attn.c_attn.bias, atol=1e-6)


def test_inputs_group():
    checks, _ = task7_test.inputs_group()
    assert_checks(checks)


def test_small_group_on_the_cpu():
    """Every mask form and dtype through the registered attention, and the tiny GPT-2 loop."""
    checks, _ = task7_test.small_group(argparse.Namespace(device="cpu", seed=None))
    assert_checks(checks)


def test_offline_without_flag_is_one_sentence(offline, capsys):
    from task7 import inference, inference_ref

    for main in (inference.main, inference_ref.main):
        assert main(["--model", "attention-kernels/no-such-gpt2"]) == 1
        out = capsys.readouterr().out.strip()
        assert len(out.splitlines()) == 1 and "--random-weights" in out and "Traceback" not in out


def test_record_falls_back_to_random_weights_when_the_hub_is_unreachable(offline, tiny_random_gpt2,
                                                                         capsys):
    from task7 import inference

    args = inference.build_parser().parse_args(["--record", "--device", "cpu"])
    setup = inference._load(args)
    assert setup.random_weights and "fallback" in setup.label
    assert "--record goes on with --random-weights" in capsys.readouterr().out


def test_without_a_tokenizer_the_prompt_is_token_ids(offline, tiny_random_gpt2, monkeypatch):
    monkeypatch.setattr(gpt2, "load_cached_tokenizer", lambda source: None)
    parser = gpt2.add_common_args(argparse.ArgumentParser())
    setup = gpt2.make_setup(parser.parse_args(["--random-weights", "--device", "cpu"]))
    assert setup.tokenizer is None and "token ids" in setup.note
    assert setup.input_ids[0].tolist() == gpt2.fixed_prompt_ids(setup.model.config.vocab_size)
    assert gpt2.render(None, [5, 6]) == "token ids: 5 6"
    given = gpt2.make_setup(parser.parse_args(["--random-weights", "--device", "cpu",
                                               "--prompt-ids", "3, 4 5"]))
    assert given.input_ids[0].tolist() == [3, 4, 5]


def test_prompt_too_long_is_refused_with_the_sentence(offline, capsys):
    from task7 import inference

    ids = " ".join(["11"] * 1000)
    code = inference.main(["--random-weights", "--device", "cpu", "--prompt-ids", ids])
    out = capsys.readouterr().out
    assert code == 2 and "GPT-2 holds only 1024 positions" in out and "Traceback" not in out


def test_inference_runs_end_to_end_on_the_cpu(offline, tiny_random_gpt2, capsys):
    from task7 import inference, inference_ref

    argv = ["--random-weights", "--greedy", "--max-new-tokens", "6", "--device", "cpu"]
    assert inference.main(argv) == 0
    ours = capsys.readouterr().out
    assert inference_ref.main(argv) == 0
    ref = capsys.readouterr().out
    for out in (ours, ref):
        assert "TTFT" in out and "TBT" in out and "tokens/s" in out
    generated = [out.split("--- generated")[1].splitlines()[1] for out in (ours, ref)]
    assert generated[0] == generated[1], "greedy ids differ between our loop and stock generate"


def test_registration_gives_our_name_sdpa_masks():
    from transformers import modeling_utils

    from task7.hf_attention import NAME, course_attention_forward, register

    register()
    functions = modeling_utils.ALL_ATTENTION_FUNCTIONS
    assert functions[NAME] is course_attention_forward
    masking = pytest.importorskip("transformers.masking_utils")
    # Without this entry create_causal_mask() returns None for our name: masks silently dropped.
    assert NAME in masking.ALL_MASK_ATTENTION_FUNCTIONS._global_mapping


@pytest.mark.gpu
@pytest.mark.slow
def test_small_group_on_the_gpu():
    checks, _ = task7_test.small_group()
    assert_checks(checks)


@pytest.mark.timed
@pytest.mark.gpu
@pytest.mark.slow
def test_parity_greedy_50_tokens():
    """Random-weight GPT-2 (and gpt2 when it loads): identical greedy ids, logits within fp32."""
    checks, metrics = task7_test.parity_group()
    assert_checks(checks)
    assert metrics["task7.parity.random_weights.tokens_equal"] == 1.0
    assert metrics["task7.parity.random_weights.hf_interface_tokens_equal"] == 1.0
