"""utils/cuda_graphs: graphs kept per owner (and dropped with it), replays equal to running the
kernels one by one; on the GPU, the R-CNN test path with its body replayed from a graph."""
import gc
import os

import numpy as np
import pytest
import torch
from torch import nn

from detectron.utils import cuda_graphs

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason='needs CUDA')


def test_graphed_method_is_made_once_per_owner_and_key_and_goes_with_the_owner():
    owner = nn.Linear(3, 2)
    double = cuda_graphs.graphed_method(owner, 'double', lambda m, x: 2 * m(x))
    assert cuda_graphs.graphed_method(owner, 'double', lambda m, x: 0 * m(x)) is double
    assert cuda_graphs.graphed_method(owner, 'other', lambda m, x: m(x)) is not double
    x = torch.randn(4, 3)
    with torch.no_grad():
        torch.testing.assert_close(double(x), 2 * owner(x), rtol=0, atol=0)  # on the CPU: fn itself
    before = len(cuda_graphs._PER_OWNER)
    del owner, double
    gc.collect()
    assert len(cuda_graphs._PER_OWNER) == before - 1


@needs_cuda
def test_rcnn_detections_with_the_graphed_body_equal_the_eager_ones():
    from detectron.core.config import assert_and_infer_cfg, cfg, merge_cfg_from_file
    from detectron.modeling import model_builder, rcnn_builder, rcnn_inference
    merge_cfg_from_file(os.path.join(REPO, 'configs', 'getting_started', 'shapes_demo_R-18-FPN_kl.yaml'))
    assert_and_infer_cfg()
    torch.manual_seed(0)
    model = model_builder.create(cfg).cuda().eval()
    with torch.no_grad():  # a classifier that lets many candidates through, so NMS has work
        model.box_outs.cls_score.bias.zero_()
    params = (rcnn_builder.image_params(cfg), rcnn_builder.decode_params(cfg), rcnn_builder.nms_params(cfg))
    images = [np.random.RandomState(seed).randint(0, 255, (150, 200, 3)).astype(np.uint8) for seed in range(3)]
    for im in images + images:  # the first call of a size captures, later ones replay
        eager = rcnn_inference.im_detect_all(model, im, *params, cuda_graphs=False)
        graphed = rcnn_inference.im_detect_all(model, im, *params, cuda_graphs=True)
        assert sum(len(b) for b in eager) > 0
        for a, b in zip(graphed, eager):
            np.testing.assert_array_equal(a, b)
    captured = cuda_graphs._PER_OWNER[model]['body_and_rpn_head']._graphs
    assert len(captured) == 1 and all(captured.values())  # one padded size, replayed (not refused)


@needs_cuda
def test_a_shape_is_captured_the_second_time_it_comes_and_replays_its_values():
    layer = nn.Conv2d(3, 4, 3).cuda().eval()
    graphed = cuda_graphs.GraphedCallable(lambda x: torch.relu(layer(x)), max_graphs=1)
    rare, common = torch.randn(1, 3, 9, 9, device='cuda'), torch.randn(1, 3, 8, 8, device='cuda')
    with torch.no_grad():
        graphed(rare)
        assert not graphed._graphs  # seen once: run directly, no capture
        for _ in range(3):
            x = torch.randn_like(common)
            torch.testing.assert_close(graphed(x), torch.relu(layer(x)), rtol=0, atol=0)
        assert list(graphed._graphs) and all(graphed._graphs.values())
        graphed(rare)  # its second time, but the one place is taken: still run directly
        assert len(graphed._graphs) == 1
