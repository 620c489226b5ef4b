"""Box metrics evaluated from scratch with pycocotools, to check the engines' evaluation against."""
import numpy as np
from pycocotools.coco import COCO
from pycocotools.cocoeval import COCOeval

METRICS = ['AP', 'AP50', 'AP75', 'APs', 'APm', 'APl', 'AP60', 'AP70', 'AP80', 'AP85', 'AP90', 'AP95']


def images_in_id_order(coco):
    """The dataset's image records in id order: the order of a detections file's per-image lists."""
    return [coco.imgs[i] for i in sorted(coco.getImgIds())]


def coco_metrics(ann_file, all_boxes):
    """The 12 box metrics of all_boxes, evaluated here from scratch with pycocotools."""
    coco = COCO(ann_file)
    json_ids = [c['id'] for c in coco.dataset['categories']]  # contiguous class j is categories[j - 1]
    results = [{'image_id': image['id'], 'category_id': json_ids[j - 1], 'score': float(score),
                'bbox': [float(x1), float(y1), float(x2 - x1 + 1), float(y2 - y1 + 1)]}
               for j in range(1, len(all_boxes)) for image, dets in zip(images_in_id_order(coco), all_boxes[j])
               for x1, y1, x2, y2, score in np.asarray(dets, np.float64).reshape(-1, 5)]
    evaluation = COCOeval(coco, coco.loadRes(results), 'bbox')
    evaluation.evaluate()
    evaluation.accumulate()
    evaluation.summarize()
    precision = evaluation.eval['precision'][:, :, :, 0, 2]  # area 'all', 100 detections
    single_iou = [precision[int(round((iou - 0.5) / 0.05))] for iou in (0.6, 0.7, 0.8, 0.85, 0.9, 0.95)]
    values = list(evaluation.stats[:6]) + [p[p > -1].mean() if (p > -1).any() else -1.0 for p in single_iou]
    return dict(zip(METRICS, map(float, values)))
