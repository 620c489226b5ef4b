"""CenterNet's training colour jitter and normalisation of a uint8 batch on CUDA, by two Triton kernels:
one sums each image's grey values, the other reads each pixel once and writes its three normalised
values. As PyTorch ops the same arithmetic took about 25 passes over the float32 batch: 2.17 ms of GPU
time per batch of 32 images at 512x512 on an H100, the kernels 0.21 ms (BENCHMARKS.md, "CenterNet speed").

The arithmetic is the loader workers' (roi_data.centernet.normalised_input, CenterNet's numpy) step for
step, with no multiply-add fused: v / 255 correctly rounded; cv2's grey conversion (green x 0.587, then
blue and red each added by a fused multiply-add, emulated in float64); brightness x a, contrast
x a + mean (1 - a), saturation x a + grey (1 - a) in each image's drawn order; the lighting added in
float64; (x - mean) / std correctly rounded. Only the grey mean is summed in another order.
"""
import torch

try:
    import triton
    import triton.language as tl
except ImportError:  # modeling.centernet's PyTorch ops everywhere
    triton = None

_BLOCK = 1024
# cv2.cvtColor's float32 BGR -> grey weights, as the float64 values of those float32s.
GREY_WEIGHTS = tuple(float(torch.tensor(w, dtype=torch.float32)) for w in (0.114, 0.587, 0.299))


def available(images):
    return triton is not None and images.is_cuda and images.dtype == torch.uint8


def jitter_normalize(images, order, alphas, lighting, mean, std, contrast, saturation):
    """images uint8 (B, H, W, 3) BGR on CUDA; order int64 (B, 3) the op of each step: the code contrast,
    saturation or another (brightness); alphas float64 (B, 3); lighting float64 (B, 3) BGR; mean, std
    float32 (3,) on the device. Returns float32 (B, 3, H, W), contiguous."""
    count, height, width = images.shape[0:3]
    pixels = height * width
    images = images.contiguous()
    blocks = triton.cdiv(pixels, _BLOCK)
    partial = torch.empty((count, blocks), dtype=torch.float32, device=images.device)
    out = torch.empty((count, 3, height, width), dtype=torch.float32, device=images.device)
    if out.numel() == 0:
        return out
    _grey_sum_kernel[(count, blocks)](images, partial, pixels, blocks, *GREY_WEIGHTS, BLOCK=_BLOCK,
                                      enable_fp_fusion=False)
    grey_mean = partial.sum(dim=1) / pixels
    # alpha and 1 - alpha (computed in float64, as numpy) in float32, as numpy multiplies by them.
    factors = torch.stack([alphas.float(), (1 - alphas).float()], dim=1).contiguous()
    _jitter_normalize_kernel[(count, blocks)](images, out, grey_mean, order.contiguous(), factors,
                                              lighting.contiguous(), mean, std, pixels, *GREY_WEIGHTS,
                                              CONTRAST=contrast, SATURATION=saturation, BLOCK=_BLOCK,
                                              enable_fp_fusion=False)
    return out


if triton is not None:
    @triton.jit
    def _unit_bgr(image, offsets, mask):
        """The BGR values / 255 (float32, correctly rounded) of an HWC image's pixels at offsets."""
        base = image + offsets.to(tl.int64) * 3
        b = tl.load(base, mask=mask, other=0).to(tl.float32)
        g = tl.load(base + 1, mask=mask, other=0).to(tl.float32)
        r = tl.load(base + 2, mask=mask, other=0).to(tl.float32)
        return tl.math.div_rn(b, 255.0), tl.math.div_rn(g, 255.0), tl.math.div_rn(r, 255.0)

    @triton.jit
    def _grey(b, g, r, weight_b, weight_g, weight_r):
        # cv2: green x its weight in float32, then blue and red each by a fused multiply-add: the float64
        # product of two float32s is exact, and its float64 sum rounded to float32 is the fused result
        # but for a rare double rounding.
        grey = g * weight_g
        grey = (b.to(tl.float64) * weight_b + grey.to(tl.float64)).to(tl.float32)
        return (r.to(tl.float64) * weight_r + grey.to(tl.float64)).to(tl.float32)

    @triton.jit
    def _grey_sum_kernel(images, partial, pixels, blocks, weight_b, weight_g, weight_r, BLOCK: tl.constexpr):
        image = tl.program_id(0)
        offsets = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
        mask = offsets < pixels
        b, g, r = _unit_bgr(images + image.to(tl.int64) * pixels * 3, offsets, mask)
        grey = _grey(b, g, r, weight_b, weight_g, weight_r)
        tl.store(partial + image * blocks + tl.program_id(1), tl.sum(tl.where(mask, grey, 0.0), axis=0))

    @triton.jit
    def _step(x, alpha, other):
        return x * alpha + other

    @triton.jit
    def _normalised(x, light, mean, std, channel):
        x = (x.to(tl.float64) + tl.load(light + channel)).to(tl.float32)
        return tl.math.div_rn(x - tl.load(mean + channel), tl.load(std + channel))

    @triton.jit
    def _jitter_normalize_kernel(images, out, grey_mean, order, factors, lighting, mean, std, pixels,
                                 weight_b, weight_g, weight_r, CONTRAST: tl.constexpr, SATURATION: tl.constexpr,
                                 BLOCK: tl.constexpr):
        image = tl.program_id(0)
        offsets = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
        mask = offsets < pixels
        b, g, r = _unit_bgr(images + image.to(tl.int64) * pixels * 3, offsets, mask)
        grey = _grey(b, g, r, weight_b, weight_g, weight_r)
        average = tl.load(grey_mean + image)
        for step in tl.static_range(3):
            op = tl.load(order + image * 3 + step)
            alpha = tl.load(factors + image * 6 + step)
            complement = tl.load(factors + image * 6 + 3 + step)
            # Brightness blends with nothing: + 0 x (1 - alpha) leaves x alpha as it is.
            other = tl.where(op == SATURATION, grey, tl.where(op == CONTRAST, average, 0.0)) * complement
            b = _step(b, alpha, other)
            g = _step(g, alpha, other)
            r = _step(r, alpha, other)
        light = lighting + image * 3
        target = out + image.to(tl.int64) * pixels * 3 + offsets
        tl.store(target, _normalised(b, light, mean, std, 0), mask=mask)
        tl.store(target + pixels, _normalised(g, light, mean, std, 1), mask=mask)
        tl.store(target + 2 * pixels, _normalised(r, light, mean, std, 2), mask=mask)
