"""On the H200: the bytes the hardware writes into shared memory, for every mode x element
width x 2D/3D box x mechanism, equal the model's and the CuTe algebra's; multicast and DSM
clusters hold identical images; TMA round trips return their input with zero fill checked."""

import pytest

from cutetma import hardware

pytestmark = pytest.mark.gpu

CASES = hardware.hardware_cases()


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_hardware_image(case):
    """Every case matches the model, except paged boxes that start inside a swizzle atom,
    whose phase is the question the case asks: one of the two readings must hold (the
    buffer's phase or the box's), never neither."""
    if case.row_offset % 8:
        row = hardware.run_case(case)
        assert row["matches_model"] or row["matches_box_phase"], row
        return
    row = hardware.run_case(case)
    assert row["match"], row


@pytest.mark.parametrize("shape,box,dtype", [
    ((203, 136), (64, 64), "float16"), ((1000, 1000), (128, 64), "bfloat16"),
    ((17, 40), (8, 32), "float32"), ((257, 48), (256, 16), "float16"),
    ((129, 160), (64, 128), "uint8"),
])
@pytest.mark.parametrize("swizzle", ["none", "128B"])
def test_round_trip(shape, box, dtype, swizzle):
    import torch

    from cutetma import ops

    t = getattr(torch, dtype)
    if swizzle == "128B" and box[1] * torch.empty(0, dtype=t).element_size() > 128:
        pytest.skip("box wider than the 128B span")
    x = (torch.randn(shape, device="cuda") * 100).to(t) if t.is_floating_point else \
        torch.randint(0, 255, shape, device="cuda", dtype=t)
    y = ops.tma_round_trip(x, box, swizzle=swizzle)
    torch.cuda.synchronize()
    assert torch.equal(y.view(torch.uint8), x.view(torch.uint8))


def test_errors_before_launch():
    import torch

    from cutetma import ops

    x = torch.randn(64, 64, device="cuda", dtype=torch.float16)
    with pytest.raises(ValueError, match="stride rule"):
        ops.smem_image(torch.randn(64, 60, device="cuda", dtype=torch.float16), (8, 8))
    with pytest.raises(ValueError, match="alignment rule"):
        ops.smem_image(x.view(-1)[1:4097 - 64].view(63, 64), (8, 64))
    with pytest.raises(ValueError, match="CUDA tensor"):
        ops.smem_image(x.cpu(), (8, 64))
    with pytest.raises(ValueError, match="swizzle-span rule"):
        ops.smem_image(x, (8, 128))
