"""KL-Loss's test-time soft-NMS with variance voting (`py_cpu_nms.soft`) on many box sets at once.

`soft` is sequential: each step selects the best live box, votes its coordinates and rescores the
others, which decides the next step. Two kernels run that loop whole, with the same arithmetic:
on CUDA tensors a Triton kernel (one program per box set, the set held in one block), elsewhere
the compiled CPU kernel `detectron.utils.cython_nms.soft_nms_with_variance_voting`.
`soft_nms_with_variance_voting` picks between them. Their results are identical except where
float64 exp or the order of a vote's float64 sum differ in the last bit, which rarely changes the
float32 they are rounded to. On the host, `soft_nms_with_variance_voting_grouped_cpu` takes the
candidates grouped by class without padding and, given Detectron's per-image limit, selects only
the boxes that the limit can keep.

On the GPU everything that does not depend on the order of selection runs first, in parallel: the
IoU of every pair of boxes (KL-Loss computes that matrix once, from the original boxes) turned
into its vote weight exp(-(1 - IoU)^2 / iou_sigma) and its rescoring factor exp(-IoU^2 / 0.5)
(or 0 / 1 in hard mode). A step of the loop then loads one row of each.
"""
from typing import List, Optional

import torch

from detectron.utils import cython_nms

try:
    import triton
    import triton.language as tl
except ImportError:  # the CPU kernel does all the work
    triton = None

# Sets wider than this run on the CPU kernel: a set must fit in one block of registers.
MAX_TRITON_SET_SIZE = 2048
# At most this many bytes of per-pair weights (float64, one or two N x N matrices per set) exist
# at once; more sets are processed in turns.
PAIR_WEIGHTS_BUDGET_BYTES = 1 << 30
_PAIR_TILE = 32


def soft_nms_with_variance_voting(boxes, scores, sigmas, counts, vote_thresh, iou_sigma,
                                  vote=True, hard_nms_thresh=None):
    """KL-Loss's `py_cpu_nms.soft` (variance voting + soft-NMS) on C independent box sets at once.

    boxes (C, N, 4) float32 (x1, y1, x2, y2), scores (C, N) float32, sigmas (C, N, 4) float32
    matched to the box columns, counts (C,): set c uses its first counts[c] rows. Follows `soft`
    step by step: position i takes the first highest score among the live positions i..
    (swapping); with `vote` its box becomes the average of the live boxes with IoU > vote_thresh
    (itself included), weighted per column by exp(-(1 - IoU)^2 / iou_sigma) / sigma^2; every later
    live box with IoU > 0 is then rescored (exp(-IoU^2 / 0.5), or 0 if IoU > hard_nms_thresh when
    given) and dropped below 0.001 by swapping it with the last live position. IoUs are those of
    the original boxes in float32 with +1 sides; box / sigma^2 and 1 / sigma^2 are float32;
    weights, vote sums and decays float64 (a decayed score is float32(float64(score) * weight)),
    like KL-Loss's numpy.

    Returns, on the input's device: order (C, N) int64 (input row at each output position: the
    selection order, then the rows not kept in increasing row order), num_kept (C,) int64, voted
    boxes (C, N, 4) float32 by output position (the original box beyond num_kept) and the final
    scores (C, N) float32 by input row. Runs the Triton kernel on CUDA tensors when Triton is
    installed and N <= MAX_TRITON_SET_SIZE, else the compiled CPU kernel.
    """
    return tuple(soft_nms_with_variance_voting_op(boxes, scores, sigmas, counts, float(vote_thresh),
                                                  float(iou_sigma), vote, hard_nms_thresh))


# A torch.library custom op (torch.export, torch.compile): the Triton kernels on CUDA, the compiled
# CPU kernel elsewhere (also for a program exported on CUDA and run where Triton is absent).
@torch.library.custom_op('detectron::soft_nms_with_variance_voting', mutates_args=())
def soft_nms_with_variance_voting_op(boxes: torch.Tensor, scores: torch.Tensor, sigmas: torch.Tensor,
                                     counts: torch.Tensor, vote_thresh: float, iou_sigma: float, vote: bool,
                                     hard_nms_thresh: Optional[float]) -> List[torch.Tensor]:
    if boxes.is_cuda and triton is not None and scores.shape[1] <= MAX_TRITON_SET_SIZE:
        return list(soft_nms_with_variance_voting_triton(boxes, scores, sigmas, counts, vote_thresh,
                                                         iou_sigma, vote, hard_nms_thresh))
    return list(soft_nms_with_variance_voting_cpu(boxes, scores, sigmas, counts, vote_thresh,
                                                  iou_sigma, vote, hard_nms_thresh))


@soft_nms_with_variance_voting_op.register_fake
def _(boxes, scores, sigmas, counts, vote_thresh, iou_sigma, vote, hard_nms_thresh):
    num_sets, width = scores.shape
    return [scores.new_empty((num_sets, width), dtype=torch.int64), scores.new_empty((num_sets,), dtype=torch.int64),
            scores.new_empty((num_sets, width, 4), dtype=torch.float32),
            scores.new_empty((num_sets, width), dtype=torch.float32)]


def soft_nms_with_variance_voting_cpu(boxes, scores, sigmas, counts, vote_thresh, iou_sigma,
                                      vote=True, hard_nms_thresh=None):
    """`soft_nms_with_variance_voting` by the compiled CPU kernel (tensors on any device)."""
    host = [t.detach().cpu().numpy() for t in (boxes, scores, sigmas, counts)]
    outputs = cython_nms.soft_nms_with_variance_voting(*host, vote_thresh, iou_sigma, vote,
                                                       hard_nms_thresh)
    return tuple(torch.from_numpy(o).to(scores.device) for o in outputs)


def soft_nms_with_variance_voting_grouped_cpu(dets, sigmas, counts, vote_thresh, iou_sigma, vote=True,
                                              hard_nms_thresh=None, max_kept=0, workers=None, kept_only=False):
    """`soft_nms_with_variance_voting` by the compiled CPU kernel on sets stored one after another
    (no padding, no work for empty sets): dets (A, 5) float32 (x1, y1, x2, y2, score), sigmas (A, 4),
    set c the next counts[c] rows. Returns, on the input's device, `after` (A, 5) float32, each
    set's rows as KL-Loss's `soft` leaves them (its kept boxes in selection order, voted, with
    their final scores, then its other rows in increasing row order with their original boxes and
    final scores), and `kept` (A,) bool, true at the rows of `after` that are kept. With
    max_kept > 0 only the kept boxes that Detectron's per-image limit of max_kept detections
    can keep are selected (see cython_nms.soft_nms_with_variance_voting_grouped). Large sets are
    stepped on 2 threads when `workers` (default: torch's intra-op threads) allows 2. kept_only:
    returns `after[kept]` (K, 5) and the set of each kept row (K,) int64 instead."""
    host = [t.detach().cpu().numpy() for t in (dets, sigmas, counts)]
    workers = torch.get_num_threads() if workers is None else workers
    outputs = cython_nms.soft_nms_with_variance_voting_grouped(*host, vote_thresh, iou_sigma, vote, hard_nms_thresh,
                                                               max_kept, min(workers, 2), kept_only)
    return tuple(torch.from_numpy(o).to(dets.device) for o in outputs)


def soft_nms_with_variance_voting_triton(boxes, scores, sigmas, counts, vote_thresh, iou_sigma,
                                         vote=True, hard_nms_thresh=None):
    """`soft_nms_with_variance_voting` by the Triton kernels (CUDA tensors, or CPU tensors under
    TRITON_INTERPRET=1); N must be at most MAX_TRITON_SET_SIZE."""
    if triton is None:
        raise RuntimeError('Triton is not installed: use soft_nms_with_variance_voting_cpu')
    num_sets, width = scores.shape
    if width > MAX_TRITON_SET_SIZE:
        raise ValueError(f'the Triton kernel handles sets of at most {MAX_TRITON_SET_SIZE} boxes, '
                         f'got {width}: use soft_nms_with_variance_voting_cpu')
    device = scores.device
    order = torch.empty((num_sets, width), dtype=torch.int64, device=device)
    num_kept = torch.zeros(num_sets, dtype=torch.int64, device=device)
    voted = torch.empty((num_sets, width, 4), dtype=torch.float32, device=device)
    final_scores = torch.empty((num_sets, width), dtype=torch.float32, device=device)
    if num_sets == 0 or width == 0:
        return order, num_kept, voted, final_scores
    boxes = boxes.float().contiguous()
    scores = scores.float().contiguous()
    counts = counts.to(device=device, dtype=torch.int32).contiguous()
    if vote:
        # KL-Loss's float32 vote terms box / sigma^2 and 1 / sigma^2, widened for float64 sums.
        variances = sigmas.float() ** 2
        vote_terms = torch.cat([boxes / variances, 1.0 / variances], dim=2).double().contiguous()
    else:
        vote_terms = boxes  # not read
    thresholds = _float64_on_device([vote_thresh, iou_sigma, hard_nms_thresh or 0.0], device)
    block = _set_block(width)
    num_matrices = 2 if vote else 1
    sets_per_turn = max(1, PAIR_WEIGHTS_BUDGET_BYTES // (num_matrices * 8 * width * width))
    hard = hard_nms_thresh is not None
    for first in range(0, num_sets, sets_per_turn):
        turn_sets = min(sets_per_turn, num_sets - first)
        decay = torch.empty((turn_sets, width, width), dtype=torch.float64, device=device)
        vote_weights = torch.empty_like(decay) if vote else decay
        tiles = triton.cdiv(width, _PAIR_TILE)
        _pair_weights_kernel[(turn_sets, tiles, tiles)](
            boxes, counts, thresholds, vote_weights, decay, first, width, VOTE=vote, HARD=hard,
            TILE=_PAIR_TILE, enable_fp_fusion=False)
        _soft_nms_vote_kernel[(turn_sets,)](
            boxes, scores, vote_terms, counts, vote_weights, decay, order, num_kept, voted,
            final_scores, first, width, VOTE=vote, HARD=hard, BLOCK=block,
            num_warps=_num_warps(block), enable_fp_fusion=False)
    return order, num_kept, voted, final_scores


def _float64_on_device(values, device):
    """Python floats as a float64 tensor, for kernels that must compare and divide in float64:
    Triton passes Python floats as float32. Filled on the device, so no copy waits for the
    queued GPU work."""
    values_t = torch.empty(len(values), dtype=torch.float64, device=device)
    for index, value in enumerate(values):
        values_t[index] = value
    return values_t


def _set_block(width):
    # At least 128 rows (one warp's registers): sets of up to 128 boxes share one compiled kernel.
    return max(128, triton.next_power_of_2(width))


def _num_warps(block):
    # About 4 rows per thread: the set's state, vote terms included, stays in registers.
    return max(1, min(16, block // 128))


if triton is not None:
    # Every kernel is launched with enable_fp_fusion=False: a product feeding a sum must be
    # rounded on its own, as in the torch and numpy code, not fused into one FMA. The float32
    # division uses div_rn because float32 `/` is approximate on NVIDIA GPUs (float64 `/` is
    # correctly rounded).

    @triton.jit
    def _load_box_columns(boxes_ptr, rows, mask):
        x1 = tl.load(boxes_ptr + rows * 4, mask=mask, other=0.0)
        y1 = tl.load(boxes_ptr + rows * 4 + 1, mask=mask, other=0.0)
        x2 = tl.load(boxes_ptr + rows * 4 + 2, mask=mask, other=0.0)
        y2 = tl.load(boxes_ptr + rows * 4 + 3, mask=mask, other=0.0)
        return x1, y1, x2, y2

    # Set widths change with every image: specialising on their divisibility would compile a kernel
    # per new combination (BENCHMARKS.md, "Start-up").
    @triton.jit(do_not_specialize=['first_set', 'width'])
    def _pair_weights_kernel(boxes_ptr, counts_ptr, thresholds_ptr, vote_weights_ptr, decay_ptr,
                             first_set, width, VOTE: tl.constexpr, HARD: tl.constexpr,
                             TILE: tl.constexpr):
        """Per pair (a, b) of a set's first `count` rows: decay[a, b] = the factor rescoring b
        when a is selected (-1 if IoU = 0: b is untouched) and vote_weights[a, b] = b's weight in
        a's vote (-1 if IoU <= vote_thresh: b does not vote). Other pairs are never read."""
        local_set = tl.program_id(0)
        set_index = first_set + local_set
        count = tl.load(counts_ptr + set_index)
        first_a, first_b = tl.program_id(1) * TILE, tl.program_id(2) * TILE
        if (first_a < count) & (first_b < count):
            _pair_weights_tile(boxes_ptr, thresholds_ptr, vote_weights_ptr, decay_ptr, local_set,
                               set_index, first_a, first_b, count, width, VOTE, HARD, TILE)

    @triton.jit
    def _pair_weights_tile(boxes_ptr, thresholds_ptr, vote_weights_ptr, decay_ptr, local_set,
                           set_index, first_a, first_b, count, width, VOTE: tl.constexpr,
                           HARD: tl.constexpr, TILE: tl.constexpr):
        a = first_a + tl.arange(0, TILE)
        b = first_b + tl.arange(0, TILE)
        a_in, b_in = a < count, b < count
        ax1, ay1, ax2, ay2 = _load_box_columns(boxes_ptr, set_index * width + a, a_in)
        bx1, by1, bx2, by2 = _load_box_columns(boxes_ptr, set_index * width + b, b_in)
        # The soft-NMS kernel's float32 steps: +1 sides, union = area_a + area_b - intersection.
        area_a = ((ax2 - ax1) + 1.0) * ((ay2 - ay1) + 1.0)
        area_b = ((bx2 - bx1) + 1.0) * ((by2 - by1) + 1.0)
        inter_w = (tl.minimum(ax2[:, None], bx2[None, :])
                   - tl.maximum(ax1[:, None], bx1[None, :])) + 1.0
        inter_h = (tl.minimum(ay2[:, None], by2[None, :])
                   - tl.maximum(ay1[:, None], by1[None, :])) + 1.0
        inter = tl.maximum(inter_w, 0.0) * tl.maximum(inter_h, 0.0)
        union = (area_a[:, None] + area_b[None, :]) - inter
        overlaps = inter > 0.0
        iou = tl.where(overlaps, tl.div_rn(inter, tl.where(overlaps, union, 1.0)), 0.0)
        iou64 = iou.to(tl.float64)

        offsets = local_set.to(tl.int64) * width * width + a[:, None] * width + b[None, :]
        mask = a_in[:, None] & b_in[None, :]
        if HARD:
            hard_thresh = tl.load(thresholds_ptr + 2)
            factor = tl.where(iou64 > hard_thresh, 0.0, 1.0).to(tl.float64)
        else:
            factor = tl.exp(-(iou64 * iou64) / 0.5)
        tl.store(decay_ptr + offsets, tl.where(overlaps, factor, -1.0), mask=mask)
        if VOTE:
            vote_thresh = tl.load(thresholds_ptr)
            iou_sigma = tl.load(thresholds_ptr + 1)
            gap = 1.0 - iou64
            weight = tl.exp(-(gap * gap) / iou_sigma)
            tl.store(vote_weights_ptr + offsets, tl.where(iou64 > vote_thresh, weight, -1.0),
                     mask=mask)

    @triton.jit
    def _priority(score, positions, rows, BLOCK: tl.constexpr):
        """int64 keys whose maximum is the first (lowest position) highest score; the row sits
        in the low bits."""
        # Equal scores must tie: -0.0 would rank below +0.0 by its bits.
        score = tl.where(score == 0.0, 0.0, score)
        bits = score.to(tl.int32, bitcast=True)
        ordered = tl.where(bits >= 0, bits, bits ^ 0x7FFFFFFF)
        position_and_row = ((BLOCK - 1 - positions) * BLOCK + rows).to(tl.int64)
        return (ordered.to(tl.int64) << 32) | position_and_row

    @triton.jit
    def _fill_holes(positions, rows, dropped, live, num_live, BLOCK: tl.constexpr):
        """KL-Loss's removal of the dropped boxes after a step: scanning forward, a dropped box
        is swapped with the last live one (examined next in its place). Net effect: the holes
        left by dropped boxes before the new live count are filled, in increasing position, by
        the live boxes beyond it in decreasing position. Dropped boxes take the movers' places."""
        num_holes = tl.sum((dropped & (positions < num_live)).to(tl.int32), axis=0)
        for _ in range(num_holes):
            hole = tl.max(tl.where(dropped & (positions < num_live),
                                   (BLOCK - 1 - positions) * BLOCK + rows, -1), axis=0)
            mover = tl.max(tl.where(live & (positions >= num_live), positions * BLOCK + rows, -1),
                           axis=0)
            hole_row, hole_position = hole % BLOCK, BLOCK - 1 - hole // BLOCK
            mover_row, mover_position = mover % BLOCK, mover // BLOCK
            positions = tl.where(rows == hole_row, mover_position,
                                 tl.where(rows == mover_row, hole_position, positions))
        return positions

    @triton.jit(do_not_specialize=['first_set', 'width'])
    def _soft_nms_vote_kernel(boxes_ptr, scores_ptr, vote_terms_ptr, counts_ptr,
                              vote_weights_ptr, decay_ptr, order_ptr, num_kept_ptr, voted_ptr,
                              final_scores_ptr, first_set, width, VOTE: tl.constexpr,
                              HARD: tl.constexpr, BLOCK: tl.constexpr):
        """KL-Loss's `soft` on one set, its state by input row: score, current position, live
        (not yet selected or dropped) and kept flags."""
        local_set = tl.program_id(0)
        set_index = first_set + local_set
        rows = tl.arange(0, BLOCK)
        columns = tl.arange(0, 4)
        in_set = rows < width
        set_rows = set_index * width + rows
        count = tl.load(counts_ptr + set_index)
        score = tl.load(scores_ptr + set_rows, mask=in_set, other=0.0)
        live = rows < count
        kept = rows < 0
        positions = rows
        if VOTE:
            term_offsets = set_rows[:, None] * 8 + columns[None, :]
            box_terms = tl.load(vote_terms_ptr + term_offsets, mask=live[:, None], other=0.0)
            inverse_variances = tl.load(vote_terms_ptr + term_offsets + 4, mask=live[:, None],
                                        other=0.0)
        pair_rows = local_set.to(tl.int64) * width * width + rows
        num_live = count
        step = 0
        while step < num_live:
            top = tl.max(tl.where(live, _priority(score, positions, rows, BLOCK), -2**63), axis=0)
            # Masks, not %: the key may be negative.
            position_and_row = (top & (BLOCK * BLOCK - 1)).to(tl.int32)
            chosen = position_and_row & (BLOCK - 1)
            best_position = BLOCK - 1 - position_and_row // BLOCK
            decay = tl.load(decay_ptr + pair_rows + chosen * width, mask=live, other=-1.0)
            if VOTE:
                weight = tl.load(vote_weights_ptr + pair_rows + chosen * width, mask=live,
                                 other=-1.0)
                voter = (live & (weight >= 0.0))[:, None]
                weight = weight[:, None]
                numerator = tl.sum(tl.where(voter, weight * box_terms, 0.0), axis=0)
                denominator = tl.sum(tl.where(voter, weight * inverse_variances, 0.0), axis=0)
                box = (numerator / denominator).to(tl.float32)
            else:
                box = tl.load(boxes_ptr + (set_index * width + chosen) * 4 + columns)
            tl.store(voted_ptr + (set_index * width + step) * 4 + columns, box)
            tl.store(order_ptr + set_index * width + step, chosen.to(tl.int64))
            kept = kept | (rows == chosen)
            positions = tl.where(rows == chosen, step,
                                 tl.where(positions == step, best_position, positions))
            live = live & (rows != chosen)

            touched = live & (decay >= 0.0)
            if HARD:
                rescored = tl.where(decay == 0.0, 0.0, score)
            else:
                # float32 score times a float64 weight, stored as float32, as numpy does.
                rescored = (score.to(tl.float64) * decay).to(tl.float32)
            score = tl.where(touched, rescored, score)
            dropped = touched & (score < 0.001)
            num_dropped = tl.sum(dropped.to(tl.int32), axis=0)
            if num_dropped > 0:
                live = live & ~dropped
                num_live = num_live - num_dropped
                positions = _fill_holes(positions, rows, dropped, live, num_live, BLOCK)
            step += 1

        tl.store(num_kept_ptr + set_index, num_live.to(tl.int64))
        tl.store(final_scores_ptr + set_rows, score, mask=in_set)
        rest = in_set & ~kept
        slots = set_index * width + num_live + tl.cumsum(rest.to(tl.int32), axis=0) - 1
        tl.store(order_ptr + slots, rows.to(tl.int64), mask=rest)
        box_offsets = set_rows[:, None] * 4 + columns[None, :]
        original = tl.load(boxes_ptr + box_offsets, mask=rest[:, None], other=0.0)
        tl.store(voted_ptr + slots[:, None] * 4 + columns[None, :], original, mask=rest[:, None])
