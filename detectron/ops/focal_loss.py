"""CenterNet's heat map loss: CornerNet's modified focal loss on the clamped sigmoid of the logits,
as one Triton reduction forward and one element-wise pass backward on CUDA.

Eager PyTorch runs the sigmoid, its clamp and the loss as about twenty element-wise passes and
reductions over the batch's largest tensor (32 x 80 x 128 x 128 float32 values at batch 32), and
channels_last logits against NCHW targets keep them off the vectorised kernels (BENCHMARKS.md,
"CenterNet speed"). The kernels read the logits in their own dtype and memory order, compute in
float32 as the reference does after its `.float()`, and sum per tile into a fixed tile order, so a
step gives the same loss every time (resumed runs stay bit for bit). Other devices take the eager
path, the reference's arithmetic.
"""
import torch

try:
    import triton
    import triton.language as tl
except ImportError:  # CPU-only installs: the eager path serves them
    triton = None

PROB_EPS = 1e-4  # CenterNet's _sigmoid clamps to [1e-4, 1 - 1e-4] so that the logs stay finite
_KERNEL_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
_BLOCK = 4096  # elements per program


def clamped_sigmoid(x):
    """sigmoid clamped to [1e-4, 1 - 1e-4] so the focal loss's logs stay finite.

    Out of place; CenterNet's version calls x.sigmoid_() in place, so its output['hm'] holds
    probabilities after the loss (the gradient is the same)."""
    return torch.clamp(torch.sigmoid(x), min=PROB_EPS, max=1 - PROB_EPS)


def neg_loss(pred, gt):
    """CornerNet's modified focal loss (CenterNet's _neg_loss), alpha 2, beta 4.

    pred: clamped probabilities, gt: Gaussian heatmaps, same shape. Summed over the whole tensor
    (all images of the batch) and divided by its number of positives (gt == 1); with none, the
    negative term alone. Dividing by max(num_pos, 1) gives exactly that without a host sync: the
    positive sum is 0 when there is no positive.
    """
    pos = gt.eq(1).float()
    neg = gt.lt(1).float()
    neg_weights = torch.pow(1 - gt, 4)
    pos_loss = (torch.log(pred) * torch.pow(1 - pred, 2) * pos).sum()
    neg_term = (torch.log(1 - pred) * torch.pow(pred, 2) * neg_weights * neg).sum()
    return -(pos_loss + neg_term) / pos.sum().clamp(min=1)


def heatmap_focal_loss(logits, gt):
    """neg_loss(clamped_sigmoid(logits.float()), gt): the heat map term of CtdetLoss, float32.
    logits (B, C, H, W) in any float dtype; gt float32 of the same shape."""
    if _use_kernel(logits, gt):
        if gt.stride() != logits.stride():
            gt = torch.empty_like(logits, dtype=gt.dtype).copy_(gt)  # the logits' memory order
        return _HeatmapFocalLoss.apply(logits, gt)
    return neg_loss(clamped_sigmoid(logits.float()), gt)


def _use_kernel(logits, gt):
    return (triton is not None and logits.is_cuda and logits.dtype in _KERNEL_DTYPES
            and gt.dtype == torch.float32 and gt.shape == logits.shape and _dense(logits))


def _dense(x):
    """Whether x's elements fill its storage span without gaps or overlaps (any dimension order)."""
    order = sorted(range(x.dim()), key=lambda d: x.stride(d))
    expected = 1
    for d in order:
        if x.size(d) != 1 and x.stride(d) != expected:
            return False
        expected *= x.size(d)
    return True


class _HeatmapFocalLoss(torch.autograd.Function):
    @staticmethod
    def forward(ctx, logits, gt):
        n = logits.numel()
        tiles = triton.cdiv(n, _BLOCK)
        partial = torch.empty(3, tiles, device=logits.device, dtype=torch.float32)
        _forward_kernel[(tiles,)](logits, gt, partial, n, tiles, EPS=PROB_EPS, BLOCK=_BLOCK)
        pos_sum, neg_sum, num_pos = partial.sum(1)
        divisor = num_pos.clamp(min=1)
        ctx.save_for_backward(logits, gt, divisor)
        return -(pos_sum + neg_sum) / divisor

    @staticmethod
    def backward(ctx, grad_loss):
        logits, gt, divisor = ctx.saved_tensors
        scale = (-grad_loss.float() / divisor).reshape(1)
        grad = torch.empty_like(logits)
        n = logits.numel()
        _backward_kernel[(triton.cdiv(n, _BLOCK),)](logits, gt, scale, grad, n, EPS=PROB_EPS, BLOCK=_BLOCK)
        return grad, None


if triton is not None:
    @triton.jit
    def _probabilities(x_ptr, gt_ptr, n, EPS: tl.constexpr, BLOCK: tl.constexpr):
        """The tile's sigmoid s, clamped p, targets (2 past the end: neither positive nor negative) and
        the negatives' weight (1 - gt)^4."""
        offsets = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
        valid = offsets < n
        x = tl.load(x_ptr + offsets, mask=valid, other=0.0).to(tl.float32)
        gt = tl.load(gt_ptr + offsets, mask=valid, other=2.0)
        s = 1.0 / (1.0 + tl.exp(-x))
        p = tl.minimum(tl.maximum(s, EPS, propagate_nan=tl.PropagateNan.ALL), 1.0 - EPS,
                       propagate_nan=tl.PropagateNan.ALL)
        one_minus_gt = 1.0 - gt
        neg_weight = one_minus_gt * one_minus_gt * one_minus_gt * one_minus_gt
        return offsets, valid, s, p, gt, neg_weight

    @triton.jit
    def _forward_kernel(x_ptr, gt_ptr, partial_ptr, n, tiles, EPS: tl.constexpr, BLOCK: tl.constexpr):
        """partial[:, tile] = (sum of the positive terms, of the negative terms, number of positives)."""
        _, _, _, p, gt, neg_weight = _probabilities(x_ptr, gt_ptr, n, EPS, BLOCK)
        one_minus_p = 1.0 - p
        pos_term = tl.where(gt == 1.0, tl.log(p) * one_minus_p * one_minus_p, 0.0)
        neg_term = tl.where(gt < 1.0, tl.log(one_minus_p) * p * p * neg_weight, 0.0)
        tile = tl.program_id(0)
        tl.store(partial_ptr + tile, tl.sum(pos_term, axis=0))
        tl.store(partial_ptr + tiles + tile, tl.sum(neg_term, axis=0))
        tl.store(partial_ptr + 2 * tiles + tile, tl.sum((gt == 1.0).to(tl.float32), axis=0))

    @triton.jit
    def _backward_kernel(x_ptr, gt_ptr, scale_ptr, grad_ptr, n, EPS: tl.constexpr, BLOCK: tl.constexpr):
        """grad = scale * d(term)/dp * [clamp passes] * s (1 - s), in the logits' dtype; scale is
        -d(loss) / max(num_pos, 1)."""
        offsets, valid, s, p, gt, neg_weight = _probabilities(x_ptr, gt_ptr, n, EPS, BLOCK)
        one_minus_p = 1.0 - p
        d_pos = one_minus_p * one_minus_p / p - 2.0 * one_minus_p * tl.log(p)
        d_neg = neg_weight * (2.0 * p * tl.log(one_minus_p) - p * p / one_minus_p)
        d_p = tl.where(gt == 1.0, d_pos, tl.where(gt < 1.0, d_neg, 0.0))
        # torch.clamp passes the gradient where min <= s <= max.
        passes = (s >= EPS) & (s <= 1.0 - EPS)
        grad = tl.where(passes, tl.load(scale_ptr) * d_p * (1.0 - s) * s, 0.0)
        tl.store(grad_ptr + offsets, grad.to(grad_ptr.dtype.element_ty), mask=valid)
