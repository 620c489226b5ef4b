"""TRAIN.CHECKPOINT_ACTIVATIONS on CenterNet's backbones: a checkpointed training step gives the plain
step's losses, gradients and BatchNorm running statistics, and does recompute the blocks."""
import numpy as np
import pytest
import torch
from torch import nn

from detectron.core.config import cfg
from detectron.modeling.activation_checkpoint import checkpointed
from detectron.modeling.centernet_builder import CenterNetType, collate_samples
from detectron.roi_data import centernet as cn


def _batch():
    params = cn.CtdetParams(input_h=64, input_w=64, num_classes=3, max_objs=4)
    boxes = np.array([[4, 6, 40, 30], [20, 2, 60, 60]], np.float32)
    samples = [cn.ctdet_train_sample(np.random.RandomState(i).randint(0, 256, (70, 80, 3)).astype(np.uint8),
                                     boxes, np.array([0, 2]), np.random.RandomState(10 + i), params)
               for i in range(1)]
    return collate_samples(samples)


def _training_step(arch, checkpoint_activations, images, targets):
    """Losses, gradients, BN buffers after one step, and how often the first conv ran."""
    c = cfg.clone()
    c.defrost()
    c.CENTERNET.ARCH = arch
    c.CENTERNET.NUM_CLASSES = 3
    c.TRAIN.CHECKPOINT_ACTIVATIONS = checkpoint_activations
    torch.manual_seed(0)
    model = CenterNetType(c).build().train()
    first_conv = next(m for m in model.backbone.modules() if isinstance(m, nn.Conv2d))
    calls = []
    first_conv.register_forward_hook(lambda *_: calls.append(1))
    losses = model(images, targets)
    losses['loss'].backward()
    grads = {name: p.grad for name, p in model.named_parameters() if p.requires_grad}
    return losses, grads, dict(model.named_buffers()), len(calls)


@pytest.mark.parametrize('arch', ['res_18', 'resdcn_18', 'dla_34'])
def test_checkpointed_step_equals_the_plain_step(arch):
    images, targets = _batch()
    plain_losses, plain_grads, plain_buffers, plain_calls = _training_step(arch, False, images, targets)
    losses, grads, buffers, calls = _training_step(arch, True, images, targets)
    assert (plain_calls, calls) == (1, 2)  # the stem ran again in the backward
    assert sorted(losses) == ['hm_loss', 'loss', 'off_loss', 'wh_loss']
    for key, value in plain_losses.items():
        assert losses[key].item() == value.item(), key
    assert plain_losses['loss'].item() > 0
    assert grads.keys() == plain_grads.keys() and len(grads) > 20
    for name, grad in plain_grads.items():
        assert grad is not None and torch.equal(grads[name], grad), name
    # The recomputation leaves BatchNorm's running statistics and batch counters as the forward did.
    assert buffers.keys() == plain_buffers.keys()
    for name, buffer in plain_buffers.items():
        assert torch.equal(buffers[name], buffer), name
    assert any(name.endswith('num_batches_tracked') and b.item() == 1 for name, b in buffers.items())


def test_checkpointed_block_updates_batchnorm_statistics_once():
    torch.manual_seed(0)
    block = nn.Sequential(nn.Conv2d(2, 4, 3), nn.BatchNorm2d(4, momentum=0.5))
    x = torch.randn(3, 2, 6, 6, requires_grad=True)
    checkpointed(True, block, x).sum().backward()
    batch_mean = torch.nn.functional.conv2d(x.detach(), block[0].weight, block[0].bias).mean(dim=(0, 2, 3))
    # momentum 0.5 from a zero running mean: half the batch mean, once (twice would give 0.75 of it).
    torch.testing.assert_close(block[1].running_mean, 0.5 * batch_mean)
    assert block[1].momentum == 0.5 and block[1].num_batches_tracked.item() == 1
    with torch.no_grad():  # no autograd: nothing to recompute, the block just runs
        checkpointed(True, block, x)
    assert block[1].num_batches_tracked.item() == 2
