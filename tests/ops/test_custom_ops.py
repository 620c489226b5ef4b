"""The Triton kernels' torch.library custom ops: away from CUDA + Triton their plain-torch reference
runs, equal to the eager op forward and backward; their fake and autograd registrations pass
torch.library.opcheck; torch.export and torch.compile (fullgraph) keep them as single ops."""
import pytest
import torch
import torch.nn.functional as F

from detectron.ops import affine_relu, deform_conv, multilevel_roi_align, upsample_add, variance_voting
from detectron.ops import nms as nms_ops
from detectron.ops.roi_pooling import map_rois_to_fpn_levels, roi_feature_transform

SCALES = [1 / 4, 1 / 8, 1 / 16, 1 / 32]


def _affine_case(residual, residual_affine):
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(2, 4, 5, 6, generator=gen, requires_grad=True)
    r = torch.randn(2, 4, 5, 6, generator=gen, requires_grad=True) if residual else None
    rw, rb = (torch.rand(4, generator=gen), torch.randn(4, generator=gen)) if residual_affine else (None, None)
    return x, torch.rand(4, generator=gen), torch.randn(4, generator=gen), r, rw, rb


def _upsample_case():
    gen = torch.Generator().manual_seed(1)
    fine = torch.randn(2, 3, 8, 6, generator=gen).contiguous(memory_format=torch.channels_last).requires_grad_()
    return fine, torch.randn(2, 3, 4, 3, generator=gen, requires_grad=True)


def _roi_case():
    gen = torch.Generator().manual_seed(2)
    features = [torch.randn(1, 3, 64 // 2 ** k, 96 // 2 ** k, generator=gen, requires_grad=True) for k in range(4)]
    xy = torch.rand(30, 2, generator=gen) * 200
    rois = torch.cat([torch.zeros(30, 1), xy, xy + torch.rand(30, 2, generator=gen) * 200], dim=1)
    return rois, map_rois_to_fpn_levels(rois[:, 1:5]) - 2, features


def _dcn_case():
    gen = torch.Generator().manual_seed(3)
    return (torch.randn(2, 3, 8, 8, generator=gen), torch.randn(2, 18, 8, 8, generator=gen) * 2,
            torch.rand(2, 9, 8, 8, generator=gen))


def _grads(out, inputs, seed=4):
    grad = torch.randn(out.shape, generator=torch.Generator().manual_seed(seed))
    return torch.autograd.grad(out, [t for t in inputs if t is not None], grad)


@pytest.mark.parametrize('residual,residual_affine', [(False, False), (True, False), (True, True)])
def test_affine_relu_reference_equals_the_eager_op(residual, residual_affine):
    x, w, b, r, rw, rb = _affine_case(residual, residual_affine)
    got = affine_relu.affine_relu_op(x, w, b, r, rw, rb)
    expected = affine_relu.eager_affine_relu(x, w, b, r, (rw, rb) if residual_affine else None)
    assert torch.equal(got, expected)
    for g, e in zip(_grads(got, [x, r]), _grads(expected, [x, r])):
        torch.testing.assert_close(g, e, rtol=0, atol=0)
    torch.library.opcheck(affine_relu.affine_relu_op, (x, w, b, r, rw, rb))


def test_upsample_add_reference_equals_the_eager_op():
    fine, coarse = _upsample_case()
    got = upsample_add.upsample_add_op(fine, coarse)
    expected = fine + F.interpolate(coarse, scale_factor=2, mode='nearest')
    assert torch.equal(got, expected)
    for g, e in zip(_grads(got, [fine, coarse]), _grads(expected, [fine, coarse])):
        torch.testing.assert_close(g, e, rtol=1e-6, atol=1e-6)  # 2x2 sums in another order
    torch.library.opcheck(upsample_add.upsample_add_op, (fine, coarse))


def test_roi_align_levels_reference_equals_roi_feature_transform():
    rois, levels, features = _roi_case()
    got = multilevel_roi_align.roi_align_levels_op(rois, levels, SCALES, 7, 2, features)
    expected = roi_feature_transform(features, rois, SCALES, output_size=7, sampling_ratio=2)
    assert torch.equal(got, expected)
    for g, e in zip(_grads(got, features), _grads(expected, features)):
        torch.testing.assert_close(g, e, rtol=0, atol=0)
    torch.library.opcheck(multilevel_roi_align.roi_align_levels_op, (rois, levels, SCALES, 7, 2, features))


@pytest.mark.parametrize('dtype', [torch.float32, torch.bfloat16])
def test_dcn_columns_reference_equals_sampled_columns(dtype):
    x, offset, mask = _dcn_case()
    got = deform_conv.sampled_columns_op(x, offset, mask, 3, 3, 1, 1, dtype)
    assert got.dtype == dtype
    assert torch.equal(got, deform_conv.sampled_columns(x, offset, mask, 3, 3, 1, 1).to(dtype))
    torch.library.opcheck(deform_conv.sampled_columns_op, (x, offset, mask, 3, 3, 1, 1, dtype))


def _nms_case():
    """Grouped boxes (G, M, 4) sorted by descending distinct score, counts, and the flat inputs."""
    gen = torch.Generator().manual_seed(5)
    xy = torch.randint(0, 60, (120, 2), generator=gen).float()
    boxes = torch.cat([xy, xy + torch.randint(4, 30, (120, 2), generator=gen).float()], dim=1)
    scores = torch.randperm(120, generator=gen).float()
    groups = torch.randint(0, 3, (120,), generator=gen)
    slots, counts = nms_ops._grouped_by_score(scores, groups)
    return boxes[slots.clamp(min=0)], counts, slots, boxes, scores, groups


def test_greedy_keep_reference_keeps_detectrons_boxes():
    """The CPU reference of bitmask NMS keeps what Detectron's kernel keeps at IoU >= 0.5."""
    grouped, counts, slots, boxes, scores, groups = _nms_case()
    keep = nms_ops.greedy_keep_op(grouped, counts, nms_ops.torchvision_nms_thresh(0.5))
    assert set(slots[keep].tolist()) == set(nms_ops.batched_nms_t(boxes, scores, groups, 0.5).tolist())
    torch.library.opcheck(nms_ops.greedy_keep_op, (grouped, counts, nms_ops.torchvision_nms_thresh(0.5)))


def test_variance_voting_op_is_the_cpu_kernel():
    grouped, counts, *_ = _nms_case()
    scores = torch.rand(grouped.shape[:2], generator=torch.Generator().manual_seed(6))
    sigmas = torch.rand(grouped.shape, generator=torch.Generator().manual_seed(7)) + 0.1
    args = (grouped, scores, sigmas, counts, 0.01, 0.02, True, None)
    for got, expected in zip(variance_voting.soft_nms_with_variance_voting_op(*args),
                             variance_voting.soft_nms_with_variance_voting_cpu(*args)):
        assert torch.equal(got, expected)
    torch.library.opcheck(variance_voting.soft_nms_with_variance_voting_op, args)


class _AllOps(torch.nn.Module):
    """Every custom op once, as the CUDA model calls them."""

    def forward(self, x, w, b, fine, coarse, rois, levels, features, dcn_x, offset, mask):
        return (affine_relu.affine_relu_op(x, w, b, None, None, None), upsample_add.upsample_add_op(fine, coarse),
                multilevel_roi_align.roi_align_levels_op(rois, levels, SCALES, 7, 2, features),
                deform_conv.sampled_columns_op(dcn_x, offset, mask, 3, 3, 1, 1, torch.float32))


def _all_inputs():
    x, w, b, *_ = _affine_case(False, False)
    return (x.detach(), w, b, *(t.detach() for t in _upsample_case()), *_roi_case()[:2],
            [f.detach() for f in _roi_case()[2]], *_dcn_case())


def test_torch_export_keeps_each_op_and_runs_its_reference():
    inputs = _all_inputs()
    program = torch.export.export(_AllOps(), inputs)
    targets = {str(node.target) for node in program.graph.nodes if node.op == 'call_function'}
    assert {'detectron.affine_relu.default', 'detectron.upsample_add.default', 'detectron.roi_align_levels.default',
            'detectron.dcn_sampled_columns.default'} <= targets
    for got, expected in zip(program.module()(*inputs), _AllOps()(*inputs)):
        assert torch.equal(got, expected)


def test_torch_compile_traces_the_ops_in_one_graph():
    inputs = _all_inputs()
    compiled = torch.compile(_AllOps(), backend='aot_eager', fullgraph=True)
    for got, expected in zip(compiled(*inputs), _AllOps()(*inputs)):
        assert torch.equal(got, expected)
