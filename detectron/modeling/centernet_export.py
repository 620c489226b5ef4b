"""CenterNet's inference as one exportable graph, and its host-side ends.

`CenterNetGraph` wraps a built CenterNet (its own modules, no copy) and runs what
centernet.forward_decode runs: the uint8 normalisation table, backbone and heads (DCN as
grid_sample and a matmul), sigmoid, the flip-test average, the 3x3 max-pool peak NMS and the
two top-K. Its input is the fixed-size uint8 network input CenterNet's test makes on the host
(the affine warp of roi_data.centernet.ctdet_test_inputs, `graph_inputs`); its output the (B, K, 6)
decoded rows in output-grid pixels. Out of the graph (`graph_detections`): that warp, and the
inverse affine back to the image with the per-image cap (centernet_decode.image_detections and
merge_image_detections, the eager test's functions). For the verification, `contested_detections`:
the positions whose peak test the PyTorch model decides within the score tolerance.
"""
import dataclasses

import torch
from torch import nn

from detectron.modeling import centernet
from detectron.modeling.centernet_decode import contested_peaks, image_detections, merge_image_detections
from detectron.utils.errors import ConfigValueError

CENTERNET_INPUT_NAMES = ('images',)
CENTERNET_OUTPUT_NAMES = ('dets',)


class CenterNetGraph(nn.Module):
    def __init__(self, model, params):
        super().__init__()
        self.model = model
        self.params = dataclasses.replace(params, cuda_graphs=False)

    def forward(self, images):
        """images (B, 3, H, W) uint8 -> dets (B', K, 6) [x1, y1, x2, y2, score, class] (B' = B / 2
        with the flip test, whose inputs are each image followed by its mirror)."""
        return centernet.forward_decode(self.model, images, self.params)


def check_exportable(params):
    """ConfigValueError for test settings the fixed-size graph does not run."""
    if params.keep_res or len(params.scales) != 1:
        raise ConfigValueError('the exported CenterNet takes one fixed input size: set CENTERNET.KEEP_RES False and one '
                         'CENTERNET.TEST_SCALES entry to export (got {} and {})'.format(params.keep_res,
                                                                                         params.scales))


def graph_inputs(sample):
    """The graph's input for a test sample (centernet.prepare_test_image): its uint8 network input."""
    return (torch.as_tensor(sample['inputs'][0]),)


def graph_detections(outputs, sample, params):
    """The graph's dets -> cls_boxes, as centernet.detect_batch makes them from the same rows."""
    dets = outputs[0]
    return merge_image_detections([image_detections(dets[0], sample['metas'][0], params.scales[0])],
                                  params.input.num_classes, max_per_image=params.max_per_image,
                                  use_soft_nms=params.nms)


def contested_detections(model, sample, tol, params):
    """cls_boxes, uncapped, of the positions of the sample's heat map whose 3x3 peak test the PyTorch
    model decides by less than tol (centernet_decode.contested_peaks): an exported model whose
    scores agree within tol may keep or drop each of them. An untrained model's flat heat map has
    many (docs/EXPORT.md)."""
    images = graph_inputs(sample)[0].to(next(model.parameters()).device)
    with torch.no_grad():
        hm, wh, reg = centernet.test_maps(model, params, images)
        rows = contested_peaks(hm, wh, reg, cat_spec_wh=params.input.cat_spec_wh, tol=tol)
    boxes, classes = image_detections(rows[0].cpu().numpy(), sample['metas'][0], params.scales[0])
    return merge_image_detections([(boxes, classes)], params.input.num_classes, max_per_image=len(boxes))
