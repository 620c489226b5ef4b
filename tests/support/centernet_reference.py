"""Plain transcriptions of CenterNet's per-point post-processing, multi-scale merge and soft-NMS
(the loops the vectorised modeling/centernet_decode.py must match bit for bit), shared by
tests/modeling/test_centernet_decode.py and test_centernet_detect.py."""
import math

import numpy as np

from detectron.roi_data.centernet import get_affine_transform


def reference_post_process(dets, c, s, h, w, num_classes):
    """CenterNet's ctdet_post_process as written there: each corner through np.dot with the
    inverse affine (a float32 point with 1 appended), stored into the float32 dets, then one
    boolean mask per class."""
    ret = []
    for i in range(dets.shape[0]):
        d = np.array(dets[i], dtype=np.float32)
        trans = get_affine_transform(c[i], s[i], 0, (w, h), inv=1)
        for k in range(d.shape[0]):
            for col in (0, 2):
                d[k, col:col + 2] = np.dot(trans, np.array([d[k, col], d[k, col + 1], 1.], dtype=np.float32))
        ret.append({j + 1: d[d[:, 5] == j, :5] for j in range(num_classes)})
    return ret


def reference_scale_detections(dets, meta, scale, num_classes):
    results = reference_post_process(dets.reshape(1, -1, 6), [meta['c']], [meta['s']], meta['out_height'],
                                      meta['out_width'], num_classes)[0]
    for j in results:
        results[j][:, :4] /= scale
    return results


def reference_merge(detections, num_classes, max_per_image, soft_nms):
    """CtdetDetector.merge_outputs: concatenate each class over the scales, soft-NMS (the loop
    transcription below) with its keep list ignored, keep scores >= the max_per_image-th best."""
    results = {}
    for j in range(1, num_classes + 1):
        results[j] = np.concatenate([d[j] for d in detections], axis=0).astype(np.float32)
        if soft_nms:
            soft_nms_loop(results[j])
    scores = np.hstack([results[j][:, 4] for j in range(1, num_classes + 1)])
    if len(scores) > max_per_image:
        thresh = np.sort(scores)[::-1][max_per_image - 1]
        results = {j: r[r[:, 4] >= thresh] for j, r in results.items()}
    return results


def reference_cls_boxes(results, num_classes):
    return [np.zeros((0, 5), np.float32)] + [results[j] for j in range(1, num_classes + 1)]


def assert_same_arrays(got, expected):
    """Same keys or length, and per entry the same float32 bits and shape."""
    keys = sorted(expected) if isinstance(expected, dict) else range(len(expected))
    assert (sorted(got) if isinstance(got, dict) else range(len(got))) == keys
    for k in keys:
        assert got[k].dtype == np.float32 and got[k].shape == expected[k].shape, k
        np.testing.assert_array_equal(got[k].view(np.int32), expected[k].view(np.int32))


def soft_nms_loop(boxes, sigma=0.5, threshold=0.001):
    """Plain transcription of CenterNet's nms.pyx soft_nms (method 2) as its compiled code computes:
    float32 storage, the `+ 1` literal as a double, exp in double."""
    f32 = np.float32
    sigma, threshold = f32(sigma), f32(threshold)
    n = boxes.shape[0]
    for i in range(boxes.shape[0]):
        best = i
        for pos in range(i + 1, n):
            if boxes[best, 4] < boxes[pos, 4]:
                best = pos
        boxes[[i, best]] = boxes[[best, i]]
        tx1, ty1, tx2, ty2 = boxes[i, :4]
        pos = i + 1
        while pos < n:
            x1, y1, x2, y2 = boxes[pos, :4]
            area = f32((float(x2 - x1) + 1.0) * (float(y2 - y1) + 1.0))
            iw = f32(float(min(tx2, x2) - max(tx1, x1)) + 1.0)
            if iw > 0:
                ih = f32(float(min(ty2, y2) - max(ty1, y1)) + 1.0)
                if ih > 0:
                    ua = f32((float(tx2 - tx1) + 1.0) * (float(ty2 - ty1) + 1.0) + float(area)
                             - float(iw * ih))
                    ov = (iw * ih) / ua
                    boxes[pos, 4] = f32(math.exp(float(-(ov * ov) / sigma))) * boxes[pos, 4]
                    if boxes[pos, 4] < threshold:
                        boxes[pos] = boxes[n - 1]
                        n -= 1
                        pos -= 1
            pos += 1
    return n
