"""RetinaNet's body and head replayed from CUDA graphs (TRAIN.CUDA_GRAPHS, TEST.CUDA_GRAPHS): the settings reach
the model and the detector; on the GPU, graphed losses, gradients and detections equal the eager ones."""
import numpy as np
import pytest
import torch

from detectron.core.config import cfg
from detectron.modeling import model_builder
from detectron.modeling.FPN import FPNBody
from detectron.modeling.rcnn_inference import ImageParams
from detectron.modeling.ResNet import ResNet
from detectron.modeling.retinanet import RetinaNet, RetinaNetParams
from detectron.modeling.retinanet_builder import inference_params, retinanet_params
from detectron.modeling.retinanet_heads import RetinaNetHead
from detectron.modeling.retinanet_inference import RetinaNetTestParams, im_detect_bbox
from detectron.utils import cuda_graphs
from tests.support.tiny_runs import use_retinanet

needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason='needs CUDA')


@pytest.mark.usefixtures('private_dataset_registrations')
@pytest.mark.parametrize('graphs, checkpoint, expected', [('True', 'False', True), ('False', 'False', False),
                                                          ('True', 'True', False)])
def test_train_cuda_graphs_reach_the_model_except_with_checkpointed_activations(tiny_catalog, tmp_path, graphs,
                                                                                checkpoint, expected):
    use_retinanet(tiny_catalog, tmp_path, 'TRAIN.CUDA_GRAPHS', graphs, 'TRAIN.CUDA_GRAPHS_MAX_SHAPES', '3',
                  'TRAIN.CHECKPOINT_ACTIVATIONS', checkpoint)
    params = retinanet_params(cfg)
    assert (params.train_cuda_graphs, params.train_max_graphs) == (expected, 3)


def _model(train_cuda_graphs=False):
    torch.manual_seed(0)
    body = FPNBody(ResNet(18, freeze_at=0), 32, min_level=3, max_level=7, extra_conv_levels=True, coarsest_stride=128)
    head = RetinaNetHead(32, num_classes=3, num_anchors=9, num_convs=2)
    return RetinaNet(body, head, RetinaNetParams(train_cuda_graphs=train_cuda_graphs)).cuda()


def _batch():
    generator = torch.Generator().manual_seed(0)
    images = torch.randn(2, 3, 256, 384, generator=generator).cuda()
    im_info = torch.tensor([[256.0, 380.0, 1.0], [240.0, 384.0, 1.0]], device='cuda')
    targets = [{'boxes': torch.tensor(b, device='cuda'), 'classes': torch.tensor(c, device='cuda'),
                'is_crowd': torch.zeros(len(c), dtype=torch.bool, device='cuda')}
               for b, c in (([[10.0, 20.0, 90.0, 120.0], [150.0, 40.0, 300.0, 200.0]], [1, 3]),
                            ([[30.0, 30.0, 60.0, 70.0]], [2]))]
    return images, im_info, targets


@pytest.mark.cuda
@needs_cuda
def test_graphed_training_losses_and_gradients_equal_the_eager_ones(deterministic_cudnn):
    eager, graphed = _model(), _model(train_cuda_graphs=True)
    batch = _batch()
    for _ in range(4):  # the first step runs eagerly, the second captures, the later ones replay
        for model in (eager, graphed):
            model.zero_grad(set_to_none=True)
            losses = model(*batch)
            sum(v for k, v in losses.items() if k.startswith('loss')).backward()
            model.losses = losses
        for key, value in eager.losses.items():
            assert torch.equal(graphed.losses[key], value), key
        for a, b in zip(eager.parameters(), graphed.parameters()):
            torch.testing.assert_close(b.grad, a.grad, rtol=1e-5, atol=1e-7)
    captures = cuda_graphs._PER_OWNER[graphed]['body_and_head']._graphs
    assert len(captures) == 1 and all(captures.values())  # replayed, not refused


@pytest.mark.cuda
@needs_cuda
def test_detections_with_the_graphed_body_and_head_equal_the_eager_ones():
    model = _model().eval()
    model.use_channels_last()  # as RetinaNetType.prepare_for_inference on a GPU
    with torch.no_grad():  # every class score 0.5: each level hands PRE_NMS_TOP_N candidates to the NMS
        model.head.cls_pred.weight.zero_()
        model.head.cls_pred.bias.zero_()
    params = RetinaNetTestParams(num_classes=4, pre_nms_top_n=100)
    images = [np.random.RandomState(seed).randint(0, 255, (150, 200, 3)).astype(np.uint8) for seed in range(2)]
    image_params = ImageParams(scale=150, max_size=200, stride=128)
    for im in images + images:
        eager = im_detect_bbox(model, im, image_params, params, cuda_graphs=False)
        graphed = im_detect_bbox(model, im, image_params, params, cuda_graphs=True)
        assert sum(len(b) for b in eager) > 0
        for a, b in zip(graphed, eager):
            np.testing.assert_array_equal(a, b)
    captured = cuda_graphs._PER_OWNER[model]['body_and_head']._graphs
    assert len(captured) == 1 and all(captured.values())


@pytest.mark.usefixtures('private_dataset_registrations')
def test_the_detector_reads_test_cuda_graphs(tiny_catalog, tmp_path):
    use_retinanet(tiny_catalog, tmp_path, 'TEST.CUDA_GRAPHS', 'False', 'TEST.CUDA_GRAPHS_MAX_SHAPES', '2')
    detect = model_builder.build_model_type(cfg).detector()
    assert detect.keywords['graphs'] == {'cuda_graphs': False, 'max_graph_shapes': 2}
    assert detect.keywords['params'] == inference_params(cfg)
