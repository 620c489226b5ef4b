"""Greedy NMS of many groups at once (e.g. every image and FPN level of a batch's proposals) by two
Triton kernels: one launch builds each group's suppression bitmask, one scans every group's mask in
parallel. torchvision's batched_nms runs one NMS per group past 20000 boxes, each ending in a host
synchronisation (a 16-image training step has 80 groups; BENCHMARKS.md, "Training speed");
here the whole batch costs two launches and no synchronisation.

The IoU is Detectron's float32 arithmetic as boxes.matrix_batched_nms_t computes it (+1 sides, each
product and the division rounded on its own: the kernels are compiled without fused multiply-adds).
"""
import torch

try:
    import triton
    import triton.language as tl
except ImportError:  # CPU-only installs: the callers use their other paths
    triton = None

BITS = 64  # boxes per mask word
# The scan holds a block of 64 mask rows of the group in registers: up to 4096 boxes a group.
MAX_GROUP_SIZE = 4096


def available(device):
    return triton is not None and device.type == 'cuda'


def greedy_keep(grouped, counts, thresh):
    """Greedy NMS keep flags (G, M) bool of grouped (G, M, 4) float32 boxes, each group's first
    counts[g] slots valid and sorted by descending score (the rest padding): box i is kept iff no
    kept earlier box of its group overlaps it at IoU > thresh."""
    num_groups, size = grouped.shape[:2]
    if size > MAX_GROUP_SIZE:
        raise ValueError('bitmask NMS takes at most {} boxes a group, got {}'.format(MAX_GROUP_SIZE, size))
    words = triton.cdiv(size, BITS)
    grouped = grouped.float().contiguous()
    counts = counts.to(torch.int32)
    masks = torch.empty((num_groups, size, words), dtype=torch.int64, device=grouped.device)
    block_rows = 32
    _mask_kernel[(num_groups, triton.cdiv(size, block_rows), words)](
        grouped, counts, masks, size, words, float(thresh), BLOCK_ROWS=block_rows, enable_fp_fusion=False)
    keep = torch.zeros((num_groups, size), dtype=torch.bool, device=grouped.device)
    _scan_kernel[(num_groups,)](masks, counts, keep, size, words, BLOCK_WORDS=_block_words(words),
                                num_warps=4)
    return keep


def _block_words(words):
    # At least 8 words (512 boxes): groups of up to 512 boxes share one compiled scan.
    return max(8, triton.next_power_of_2(words))


if triton is not None:
    @triton.jit
    def _or(a, b):
        return a | b

    # Group sizes change with every image: specialising on their divisibility would compile a
    # kernel per new combination (BENCHMARKS.md, "Start-up").
    @triton.jit(do_not_specialize=['size', 'words'])
    def _mask_kernel(boxes_ptr, counts_ptr, masks_ptr, size, words, thresh, BLOCK_ROWS: tl.constexpr):
        """masks[g, i, w] bit k: box i suppresses box j = 64 w + k (j later than i, both valid,
        IoU > thresh)."""
        g = tl.program_id(0).to(tl.int64)
        i = tl.program_id(1) * BLOCK_ROWS + tl.arange(0, BLOCK_ROWS)
        w = tl.program_id(2)
        k = tl.arange(0, 64)
        j = w * 64 + k
        count = tl.load(counts_ptr + g)
        rows, cols = i < count, j < count
        group = boxes_ptr + g * size * 4
        ax1, ay1 = tl.load(group + i * 4, mask=rows, other=0.0), tl.load(group + i * 4 + 1, mask=rows, other=0.0)
        ax2, ay2 = tl.load(group + i * 4 + 2, mask=rows, other=0.0), tl.load(group + i * 4 + 3, mask=rows, other=0.0)
        bx1, by1 = tl.load(group + j * 4, mask=cols, other=0.0), tl.load(group + j * 4 + 1, mask=cols, other=0.0)
        bx2, by2 = tl.load(group + j * 4 + 2, mask=cols, other=0.0), tl.load(group + j * 4 + 3, mask=cols, other=0.0)
        iw = tl.minimum(ax2[:, None], bx2[None, :]) - tl.maximum(ax1[:, None], bx1[None, :]) + 1.0
        ih = tl.minimum(ay2[:, None], by2[None, :]) - tl.maximum(ay1[:, None], by1[None, :]) + 1.0
        inter = tl.maximum(iw, 0.0) * tl.maximum(ih, 0.0)
        area_a = (ax2 - ax1 + 1.0) * (ay2 - ay1 + 1.0)
        area_b = (bx2 - bx1 + 1.0) * (by2 - by1 + 1.0)
        iou = tl.div_rn(inter, area_a[:, None] + area_b[None, :] - inter)
        bits = (iou > thresh) & (j[None, :] > i[:, None]) & rows[:, None] & cols[None, :]
        one = tl.full((64,), 1, tl.int64)
        word = tl.reduce(tl.where(bits, (one << k.to(tl.int64))[None, :], 0), 1, _or)
        tl.store(masks_ptr + (g * size + i) * words + w, word, mask=i < size)

    @triton.jit(do_not_specialize=['size', 'words'])
    def _scan_kernel(masks_ptr, counts_ptr, keep_ptr, size, words, BLOCK_WORDS: tl.constexpr):
        """The greedy pass over one group, 64 boxes at a time: the block's own mask words decide,
        box after box, which of its boxes stay (those no kept earlier box removed); the mask rows
        of the kept ones then join the group's removed bits."""
        g = tl.program_id(0).to(tl.int64)
        count = tl.load(counts_ptr + g)
        word_index = tl.arange(0, BLOCK_WORDS)
        k = tl.arange(0, 64)
        one = tl.full((), 1, tl.int64)
        removed = tl.zeros((BLOCK_WORDS,), dtype=tl.int64)
        for block in range(0, tl.cdiv(count, 64)):
            rows = block * 64 + k
            tile = tl.load(masks_ptr + (g * size + rows[:, None]) * words + word_index[None, :],
                           mask=(rows < count)[:, None] & (word_index < words)[None, :], other=0)
            own = tl.sum(tl.where(word_index[None, :] == block, tile, 0), 1)  # row r's bits for this block
            gone = tl.sum(tl.where(word_index == block, removed, 0), 0)
            kept = tl.zeros((), dtype=tl.int64)
            for r in range(0, 64):
                take = ((gone >> r) & 1) == 0
                take = take & (block * 64 + r < count)
                row_bits = tl.sum(tl.where(k == r, own, 0), 0)
                gone = tl.where(take, gone | row_bits, gone)
                kept = tl.where(take, kept | (one << r), kept)
            kept_rows = ((kept >> k.to(tl.int64)) & 1) != 0
            removed = removed | tl.reduce(tl.where(kept_rows[:, None], tile, 0), 0, _or)
            tl.store(keep_ptr + g * size + rows, kept_rows, mask=rows < count)
