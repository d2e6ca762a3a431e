"""Checks the torch entry points share, run before anything is planned or launched
(``ops``: gemm, attention; ``backward``): an operand is a tensor of the rank the call takes,
in fp16 or bf16, on a CUDA device (each refused with one message naming the call); a
nondeterministic path under ``torch.use_deterministic_algorithms`` is refused (or warned
about, in torch's warn-only mode). The checks particular to a call (shapes that must agree,
strides, page tables) stay with it."""

from __future__ import annotations

import torch

HALF_DTYPES = (torch.float16, torch.bfloat16)


def check_operand(name: str, t, op: str, dims: int, layout: str = "",
                  dtypes: tuple | None = None) -> None:
    """Refuse ``t`` (argument ``name`` of ``op``) unless it is a ``dims``-D CUDA tensor of
    one of ``dtypes`` (default fp16 / bf16); ``layout`` names the expected dims in the
    message (e.g. "(batch, seqlen, heads, head_dim)")."""
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if t.dim() != dims:
        raise ValueError(f"{name} must be {layout or f'{dims}D'}, got shape {tuple(t.shape)}")
    if dtypes is None and t.dtype not in HALF_DTYPES:
        raise TypeError(f"{name} has dtype {t.dtype}: {op} takes float16 or bfloat16")
    if dtypes is not None and t.dtype not in dtypes:
        raise TypeError(f"{name} has dtype {t.dtype}: {op} takes "
                        + " or ".join(str(x).removeprefix("torch.") for x in dtypes))
    if t.device.type != "cuda":
        raise ValueError(f"{name} is on {t.device}: {op} needs CUDA tensors")


def attention_config(config, kind: type, head_dim: int, causal: bool, default):
    """The configuration an attention call runs: ``default()`` where ``config`` is None,
    else ``config`` itself once it is a ``kind`` made for this head dim and mask (a clear
    error before launch otherwise)."""
    if config is None:
        return default()
    if not isinstance(config, kind):
        raise TypeError(f"config must be a{'n' if kind.__name__[0] in 'AEIOU' else ''} "
                        f"{kind.__name__}, got {type(config).__name__}")
    if (config.head_dim, config.causal) != (head_dim, causal):
        raise ValueError(f"config is for head_dim={config.head_dim}, causal={config.causal}; "
                         f"the call has head_dim={head_dim}, causal={causal}")
    return config


def refuse_nondeterministic(message: str, stacklevel: int = 3) -> None:
    """Under ``torch.use_deterministic_algorithms(True)``: raise ``message`` as a
    RuntimeError, or in torch's warn-only mode warn it (torch's own convention). The caller
    decides whether its path is nondeterministic."""
    if not torch.is_deterministic_algorithms_warn_only_enabled():
        raise RuntimeError(message)
    import warnings

    warnings.warn(message, stacklevel=stacklevel)


def tma_rows_aligned(x: torch.Tensor) -> bool:
    """Whether a (b, s, h, d) operand can be a TMA source as it is: d contiguous, its base and
    every other stride multiples of 16 bytes (else the call copies it into a fresh contiguous
    tensor)."""
    return x.stride(-1) == 1 and x.data_ptr() % 16 == 0 and all(
        s * x.element_size() % 16 == 0 for s in x.stride()[:-1])
