"""CenterNet's backbone and heads replayed from CUDA graphs in training (TRAIN.CUDA_GRAPHS): the setting
reaches the model; the graphed step gives the eager losses, gradients and BatchNorm statistics."""
import numpy as np
import pytest
import torch

from detectron.core.config import cfg
from detectron.modeling import model_builder
from detectron.modeling.centernet import CenterNet
from detectron.modeling.centernet_backbones import build_centernet_backbone
from detectron.modeling.centernet_builder import collate_samples
from detectron.modeling.centernet_heads import CenterNetHeads
from detectron.roi_data import centernet as cn
from detectron.utils import cuda_graphs
from tests.support.tiny_runs import use_centernet

needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason='needs CUDA')


@pytest.mark.usefixtures('private_dataset_registrations')
@pytest.mark.parametrize('graphs, checkpoint, expected', [('True', 'False', 3), ('False', 'False', 0),
                                                          ('True', 'True', 0)])
def test_train_cuda_graphs_reach_the_model_except_with_checkpointed_activations(tiny_catalog, tmp_path, graphs,
                                                                                checkpoint, expected):
    use_centernet(tiny_catalog, tmp_path, 'TRAIN.CUDA_GRAPHS', graphs, 'TRAIN.CUDA_GRAPHS_MAX_SHAPES', '3',
                  'TRAIN.CHECKPOINT_ACTIVATIONS', checkpoint)
    assert model_builder.create(cfg).train_max_graphs == expected


def _model(arch, train_max_graphs=0):
    torch.manual_seed(0)
    backbone = build_centernet_backbone(arch)
    heads = CenterNetHeads(backbone.out_channels, {'hm': 3, 'wh': 2, 'reg': 2}, 64, 'dla' if arch == 'dla_34' else 'resdcn')
    return CenterNet(backbone, heads, train_max_graphs=train_max_graphs).train()


def _batch(size=128, count=2):
    params = cn.CtdetParams(input_h=size, input_w=size, num_classes=3, max_objs=4)
    boxes = np.array([[4, 6, 60, 50], [40, 20, 120, 110]], np.float32)
    samples = [cn.ctdet_train_sample(np.random.RandomState(i).randint(0, 256, (size, size, 3)).astype(np.uint8),
                                     boxes, np.array([0, 2]), np.random.RandomState(10 + i), params)
               for i in range(count)]
    return collate_samples(samples)


def test_the_graphed_model_gives_the_eager_losses_where_it_runs_eagerly():
    """On the CPU the graphed call runs the backbone and heads directly: the heads' outputs reach the
    losses under their own names."""
    images, targets = _batch(size=64)
    eager, graphed = (_model('res_18', graphs) for graphs in (0, 8))
    want, got = eager(images, targets), graphed(images, targets)
    assert set(got) == {'loss', 'hm_loss', 'wh_loss', 'off_loss'}
    for key, value in want.items():
        assert torch.equal(got[key], value), key
    assert cuda_graphs._PER_OWNER[graphed]['backbone_and_heads']._graphs == {}


@pytest.mark.cuda
@needs_cuda
@pytest.mark.parametrize('arch, autocast', [('resdcn_18', False), ('resdcn_18', True), ('dla_34', True)])
def test_graphed_training_gives_the_eager_losses_gradients_and_statistics(deterministic_cudnn, monkeypatch, arch,
                                                                          autocast):
    """Four steps: the first runs eagerly, the second captures, the later ones replay. The forward is
    the eager one bit for bit (losses and BatchNorm's running statistics); the DCN backward adds
    with atomics, so gradients match as two eager runs do."""
    monkeypatch.setattr(torch.backends.cudnn, 'allow_tf32', False)
    monkeypatch.setattr(torch.backends.cuda.matmul, 'allow_tf32', False)
    images, targets = _batch()
    images, targets = images.cuda(), {k: v.cuda() for k, v in targets.items()}
    eager, graphed = _model(arch).cuda(), _model(arch, train_max_graphs=8).cuda()
    if autocast:  # as train_net runs it on a GPU
        for model in (eager, graphed):
            model.use_channels_last()
    for _ in range(4):
        for model in (eager, graphed):
            model.zero_grad(set_to_none=True)
            with torch.autocast('cuda', dtype=torch.bfloat16, enabled=autocast):
                model.losses = model(images, targets)
            model.losses['loss'].backward()
        for key, value in eager.losses.items():
            assert torch.equal(graphed.losses[key], value), key
        for (name, a), b in zip(eager.named_parameters(), graphed.parameters()):
            scale = a.grad.abs().max().clamp(min=1e-12)
            assert float((b.grad - a.grad).abs().max() / scale) < (1e-2 if autocast else 1e-4), name
        for (name, a), b in zip(eager.named_buffers(), graphed.buffers()):
            assert torch.equal(b, a), name
    captures = cuda_graphs._PER_OWNER[graphed]['backbone_and_heads']._graphs
    assert len(captures) == 1 and all(captures.values())  # replayed, not refused
