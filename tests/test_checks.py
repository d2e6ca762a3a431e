"""The torch face's shared checks (``cutetma.checks``), on the CPU: an operand's type, rank,
dtype and device, each refused with the call's name; a nondeterministic path refused under
``torch.use_deterministic_algorithms`` and only warned about in its warn-only mode."""

import pytest
import torch

from cutetma.checks import check_operand, refuse_nondeterministic


def test_operand_checks_name_the_call():
    with pytest.raises(TypeError, match="a must be a torch.Tensor"):
        check_operand("a", [1, 2], "gemm", 2)
    with pytest.raises(ValueError, match=r"q must be \(batch, seqlen, heads, head_dim\)"):
        check_operand("q", torch.zeros(2, 3, dtype=torch.bfloat16), "attention", 4,
                      "(batch, seqlen, heads, head_dim)")
    with pytest.raises(TypeError, match="gemm takes float16 or bfloat16"):
        check_operand("a", torch.zeros(2, 3), "gemm", 2)
    with pytest.raises(ValueError, match="attention_backward needs CUDA tensors"):
        check_operand("dout", torch.zeros(1, 2, 3, 4, dtype=torch.float16),
                      "attention_backward", 4)


def test_nondeterminism_raises_or_warns_as_torch_asks():
    torch.use_deterministic_algorithms(True)
    try:
        with pytest.raises(RuntimeError, match="not deterministic"):
            refuse_nondeterministic("this sum is not deterministic")
        torch.use_deterministic_algorithms(True, warn_only=True)
        with pytest.warns(UserWarning, match="not deterministic"):
            refuse_nondeterministic("this sum is not deterministic")
    finally:
        torch.use_deterministic_algorithms(False)


def test_attention_config_is_the_default_or_a_matching_config():
    """``attention_config``: None takes the default; a config of another kind, head dim or
    mask is refused before any launch, naming what the call has."""
    from cutetma.checks import attention_config
    from cutetma.kernels.attention.config import AttentionConfig, BackwardConfig

    made = AttentionConfig(head_dim=128, causal=True)
    assert attention_config(None, AttentionConfig, 128, True, lambda: made) is made
    own = AttentionConfig(head_dim=64, causal=False, block_n=64)
    assert attention_config(own, AttentionConfig, 64, False, lambda: made) is own
    with pytest.raises(TypeError, match="an AttentionConfig, got BackwardConfig"):
        attention_config(BackwardConfig(), AttentionConfig, 128, False, lambda: made)
    with pytest.raises(TypeError, match="a BackwardConfig"):
        attention_config(own, BackwardConfig, 64, False, lambda: made)
    with pytest.raises(ValueError, match="config is for head_dim=64, causal=False; the call "
                                         "has head_dim=128, causal=True"):
        attention_config(own, AttentionConfig, 128, True, lambda: made)
