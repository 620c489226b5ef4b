"""The R-CNN training step with fixed-size proposals and RoIs (what a GPU runs, so that nothing waits
for it) against the compact ones the CPU runs: the same losses and gradients, on the CPU and on CUDA."""
import dataclasses
import os

import pytest
import torch

from detectron.modeling import generalized_rcnn, model_builder
from detectron.modeling.generalized_rcnn import ProposalParams
from detectron.roi_data.loader import to_device
from detectron.roi_data.minibatch import polygon_targets
from tests.support.host_reads import HostReads

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.fixture(params=['shapes_demo_R-18-FPN_kl.yaml', 'shapes_demo_mask_R-18-FPN.yaml',
                        'shapes_demo_keypoint_R-18-FPN.yaml'])
def model(request):
    from detectron.core.config import assert_and_infer_cfg, cfg, merge_cfg_from_file
    merge_cfg_from_file(os.path.join(REPO, 'configs', 'getting_started', request.param))
    assert_and_infer_cfg()
    torch.manual_seed(0)
    model = model_builder.create(cfg).train()
    # 60 proposals for the batch and 32 RoIs per image: a random subset of the candidates, each drawn by
    # what it is (its gt or proposal index), so both paths, whatever their padding, sample the same RoIs.
    model.params = dataclasses.replace(model.params, batch_size_per_im=32,
                                       train_proposals=ProposalParams(300, 60, 0.7, 0.0))
    return model


def _batch(seed, num_classes):
    """Two images with 2 and 1 objects (classes 1 and 2, below num_classes), each with its box outline as
    its polygon (read by the mask head only) and five visible keypoints at its centre (the keypoint head's)."""
    g = torch.Generator().manual_seed(seed)
    images = torch.randn(2, 3, 128, 160, generator=g) * 50
    im_info = torch.tensor([[128., 150., 1.0], [120., 160., 1.0]])
    boxes = [torch.tensor([[10., 12., 60., 70.], [70., 20., 140., 100.]]), torch.tensor([[30., 30., 90., 80.]])]
    targets = []
    for b in boxes:
        keypoints = torch.stack(((b[:, 0] + b[:, 2]) / 2, (b[:, 1] + b[:, 3]) / 2, torch.full((len(b),), 2.0)), dim=1)
        targets.append({'boxes': b, 'classes': torch.tensor([1, 2][:len(b)]).clamp(max=num_classes - 1),
                        'is_crowd': torch.zeros(len(b), dtype=torch.bool),
                        'keypoints': keypoints.unsqueeze(2).expand(-1, -1, 5).contiguous(),
                        **polygon_targets([[[x1, y1, x2, y1, x2, y2, x1, y2]] for x1, y1, x2, y2 in b.tolist()])})
    return images, im_info, targets


def _to(batch, device):
    images, im_info, targets = batch
    return images.to(device), im_info.to(device), to_device(targets, device)


def _losses_and_grads(model, batch, fixed_size, monkeypatch):
    monkeypatch.setattr(generalized_rcnn, 'fixed_size_training_rois', lambda device: fixed_size)
    model.zero_grad(set_to_none=True)
    torch.manual_seed(7)
    losses = model(*batch)
    sum(v for k, v in losses.items() if k.startswith('loss')).backward()
    grads = {name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None}
    return {k: v.detach() for k, v in losses.items()}, grads


@pytest.mark.parametrize('device', ['cpu', pytest.param('cuda', marks=[pytest.mark.cuda, pytest.mark.skipif(
    not torch.cuda.is_available(), reason='needs CUDA (the bitmask NMS and RoIAlign kernels)')])])
@pytest.mark.parametrize('seed', [0, 1])
def test_fixed_size_rois_give_the_compact_losses_and_gradients(model, seed, device, monkeypatch):
    # The fixed-size mask batch has more rows than the compact one, and cuDNN chooses its algorithm by the
    # batch: in TF32 the mask head's convolutions would round differently in the two paths.
    monkeypatch.setattr(torch.backends.cudnn, 'allow_tf32', False)
    model.to(device)
    batch = _to(_batch(seed, model.params.num_classes), device)
    compact_losses, compact_grads = _losses_and_grads(model, batch, False, monkeypatch)
    fixed_losses, fixed_grads = _losses_and_grads(model, batch, True, monkeypatch)
    assert sorted(fixed_losses) == sorted(compact_losses)
    assert compact_losses['loss_cls'] > 0 and compact_losses['loss_bbox'] != 0
    for name, value in compact_losses.items():
        torch.testing.assert_close(fixed_losses[name], value, rtol=1e-5, atol=1e-7, msg=name)
    assert sorted(fixed_grads) == sorted(compact_grads)
    for name, grad in compact_grads.items():
        if device == 'cpu':
            torch.testing.assert_close(fixed_grads[name], grad, rtol=1e-4, atol=1e-6, msg=name)
        else:  # CUDA's atomic sums differ run to run: the compact path against itself differs by
            # up to 3e-4 of a gradient's norm (H200), so each gradient is compared by its norm.
            error = (fixed_grads[name] - grad).norm()
            assert error <= 2e-3 * grad.norm(), (name, error.item(), grad.norm().item())


@pytest.mark.parametrize('bound', [None, 0, -1])
def test_the_graphed_rpn_stage_run_eagerly_gives_the_compact_losses(model, bound, monkeypatch):
    """With training CUDA graphs on, the RPN targets and proposals go through the graphed stage (gt padded
    to 16 columns, outputs packed flat); on the CPU it runs eagerly, and must give the compact losses. A
    batch with more (image, anchor, gt column) triples than the bound takes the ungraphed path."""
    if bound is not None:  # the batch's triples (+ bound): 2 images x 16 columns x the anchors of 5 levels
        anchors = sum(h * w for h, w in ((32, 40), (16, 20), (8, 10), (4, 5), (2, 3))) * 3
        monkeypatch.setattr(generalized_rcnn, '_GRAPHED_RPN_PAIRS', 2 * 16 * anchors + bound)
    batch = _batch(0, model.params.num_classes)
    compact_losses, compact_grads = _losses_and_grads(model, batch, False, monkeypatch)
    model.params = dataclasses.replace(model.params, train_cuda_graphs=True)
    calls = []
    stage = generalized_rcnn.GeneralizedRCNN._fixed_size_rpn_and_roi_targets
    monkeypatch.setattr(generalized_rcnn.GeneralizedRCNN, '_fixed_size_rpn_and_roi_targets',
                        lambda self, *tensors: calls.append(tensors[-4].shape) or stage(self, *tensors))
    staged_losses, staged_grads = _losses_and_grads(model, batch, True, monkeypatch)
    assert calls == ([] if bound == -1 else [(2, 16, 4)])  # the padded gt
    for name, value in compact_losses.items():
        torch.testing.assert_close(staged_losses[name], value, rtol=1e-5, atol=1e-7, msg=name)
    for name, grad in compact_grads.items():
        torch.testing.assert_close(staged_grads[name], grad, rtol=1e-4, atol=1e-6, msg=name)


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason='needs CUDA (CUDA graphs)')
def test_graphed_training_steps_give_the_eager_losses_step_by_step(model, monkeypatch):
    """Four forwards and backwards at fixed weights with the training graphs (the body's and the RPN
    stage's, which draws the RPN's random samples) and four without, from the same random state: the same
    losses bit for bit at every step, replays included, and the generator left where the eager steps leave it."""
    model.cuda()
    batch = _to(_batch(0, model.params.num_classes), 'cuda')

    def steps(graphs):
        model.params = dataclasses.replace(model.params, train_cuda_graphs=graphs)
        monkeypatch.setattr(generalized_rcnn, 'fixed_size_training_rois', lambda device: True)
        torch.cuda.manual_seed(11)
        out = []
        for _ in range(4):
            model.zero_grad(set_to_none=True)
            losses = model(*batch)
            sum(v for k, v in losses.items() if k.startswith('loss')).backward()
            out.append({k: v.detach().clone() for k, v in losses.items()})
        return out, torch.cuda.get_rng_state()

    eager, eager_state = steps(False)
    graphed, graphed_state = steps(True)
    stage = generalized_rcnn.graphed_method(model, 'rpn_and_roi_targets', None)
    assert [bool(entry) for entry in stage._graphs.values()] == [True]  # captured at the second step
    for step, (a, b) in enumerate(zip(eager, graphed)):
        for name in a:
            assert torch.equal(a[name], b[name]), (step, name, a[name].item(), b[name].item())
    assert torch.equal(eager_state, graphed_state)


def test_fixed_size_mask_targets_up_to_four_images_of_detectrons_fg_rois():
    detectron = generalized_rcnn.RCNNParams(num_classes=81)  # 512 RoIs per image, 25% fg: 128 fg rows per image
    assert [generalized_rcnn.fixed_size_mask_rows(n, detectron, True) for n in (1, 2, 4, 5)] == [128, 256, 512, None]
    assert generalized_rcnn.fixed_size_mask_rows(2, detectron, False) is None  # compact RoIs, compact targets
    small = dataclasses.replace(detectron, batch_size_per_im=64)  # 16 fg rows per image
    assert generalized_rcnn.fixed_size_mask_rows(32, small, True) == 512


@pytest.mark.parametrize('model', ['shapes_demo_mask_R-18-FPN.yaml'], indirect=True)
def test_past_the_bound_fixed_size_rois_take_the_compact_mask_targets(model, monkeypatch):
    """With more mask rows than _FIXED_SIZE_MASK_ROWS the fixed-size RoIs get the compact mask targets
    (max_rows None), whose loss is the same."""
    batch = _batch(0, model.params.num_classes)
    calls = []
    targets_of = generalized_rcnn.mask_targets
    monkeypatch.setattr(generalized_rcnn, 'mask_targets',
                        lambda *args, **kwargs: calls.append(kwargs['max_rows']) or targets_of(*args, **kwargs))
    fixed, _ = _losses_and_grads(model, batch, True, monkeypatch)
    monkeypatch.setattr(generalized_rcnn, '_FIXED_SIZE_MASK_ROWS', 15)  # the batch's 2 x 8 rows, less one
    bounded, _ = _losses_and_grads(model, batch, True, monkeypatch)
    assert calls == [16, None]
    torch.testing.assert_close(bounded['loss_mask'], fixed['loss_mask'], rtol=1e-5, atol=1e-7)
    assert fixed['loss_mask'] > 0


def test_the_fixed_size_training_step_reads_nothing_on_the_host(model, monkeypatch):
    """The CPU's view of the training step's host syncs on a GPU (the fixed-size path, forward and backward):
    nothing is read on the host but by the CPU's RoIAlign (ops/sparse_roi_align.py, a GPU's is a kernel)
    and, for Keypoint R-CNN, whose RoIs are sampled eagerly, its keypoint targets (the control)."""
    monkeypatch.setattr(generalized_rcnn, 'fixed_size_training_rois', lambda device: True)
    batch = _batch(0, model.params.num_classes)
    with HostReads(monkeypatch) as host:
        losses = model(*batch)
        sum(v for k, v in losses.items() if k.startswith('loss')).backward()
    reads = sorted({caller.split(':')[0] for _, caller in host.reads} - {'ops/sparse_roi_align.py'})
    assert reads == (['roi_data/keypoint_rcnn.py'] if model.keypoint_head is not None else [])
    assert any(caller.startswith('ops/sparse_roi_align.py') for _, caller in host.reads)
