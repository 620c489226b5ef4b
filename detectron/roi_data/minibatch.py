"""Training minibatches: roidb entries -> (images, im_info, targets) as in docs/DESIGN.md "Batches".

Per image: read (BGR), flip if the entry is a flipped copy, subtract means and resize to the drawn
training scale. Per batch: pad to a multiple of the stride and attach the ground truth in original
image coordinates (the roidb already holds flipped boxes for flipped entries). When the training
device does the mean subtraction, resize and padding (TRAIN.RESIZE_ON_DEVICE on a GPU), the workers
stop after the flip: UnresizedImages.
"""

import contextlib
import logging
import os
import sys
import tempfile

import cv2
import numpy as np
import torch

from detectron.datasets.proposal_files import proposal_rows
from detectron.roi_data.shared_memory import empty_for_main_process
from detectron.utils import segms as segm_utils
from detectron.utils.blob import blob_shape, fill_blob, prep_im_for_blob, resize_scale
from detectron.utils.errors import DatasetError

logger = logging.getLogger(__name__)

_JPEG_SOI, _JPEG_EOI, _JPEG_SOS = b'\xff\xd8', b'\xff\xd9', 0xDA
# Markers without a length field: TEM and the restart markers RST0..RST7.
_JPEG_STANDALONE = {0x01} | set(range(0xD0, 0xD8))


# Pixels as stored in the file, as COCO's annotations (and their width and height) give them: OpenCV
# would otherwise turn an image by its EXIF orientation tag (cv2.imread's default, Detectron's reader),
# putting an annotated image's pixels off its boxes (docs/DATASETS.md, "Images").
IMREAD_FLAGS = cv2.IMREAD_COLOR | cv2.IMREAD_IGNORE_ORIENTATION


def read_image(path):
    """Read an image file as a BGR uint8 HxWx3 array: its bytes are read once and decoded by
    cv2.imdecode with IMREAD_FLAGS, the pixels in their stored orientation (an EXIF orientation tag
    is ignored, as COCO's annotations do; cv2.imread, Detectron's reader, would apply it).

    A truncated JPEG is refused: libjpeg would decode it with grey rows and only warn "Premature end
    of JPEG file", without the file name.
    """
    try:
        with open(path, 'rb') as f:
            data = f.read()
    except OSError:
        data = b''
    if _is_truncated_jpeg(data):
        raise DatasetError(
            f"Image '{path}' is a truncated JPEG (it ends before its end-of-image marker, e.g. an interrupted "
            "download or copy); restore the file or remove it from the dataset.")
    im = _decode(data, path) if data else None
    if im is None:
        raise DatasetError(
            f"Cannot read image '{path}': the file is missing, unreadable or not a valid image; "
            "restore it or remove it from the dataset.")
    return im


def _decode(data, path):
    """cv2.imdecode of the bytes; libjpeg prints its warnings about corrupt data ("Corrupt JPEG data: 608
    extraneous bytes before marker 0xd9") to the process's stderr without the file name: they are logged
    as a warning that names the file, and any other text written there meanwhile is passed on."""
    array = np.frombuffer(data, dtype=np.uint8)
    if not data.startswith(_JPEG_SOI):
        return cv2.imdecode(array, IMREAD_FLAGS)
    with _stderr_captured() as captured:
        im = cv2.imdecode(array, IMREAD_FLAGS)
    text = captured[0].strip()
    if 'JPEG' in text:
        logger.warning("Image '%s' holds corrupt JPEG data (libjpeg: %s): it decodes with wrong pixels; restore "
                       "the file or remove it from the dataset", path, ' '.join(text.splitlines()))
    elif text:
        os.write(2, captured[0].encode())
    return im


_capture_files = {}  # {process id: the file that _stderr_captured points descriptor 2 at}; forks get their own


@contextlib.contextmanager
def _stderr_captured():
    """What native code writes to file descriptor 2 within the block, as a one-element list."""
    capture = _capture_files.get(os.getpid())
    if capture is None:
        capture = _capture_files[os.getpid()] = tempfile.TemporaryFile()  # noqa: SIM115 (kept open for the process)
    capture.seek(0)
    capture.truncate()
    sys.stderr.flush()
    saved = os.dup(2)
    os.dup2(capture.fileno(), 2)
    captured = []
    try:
        yield captured
    finally:
        os.dup2(saved, 2)
        os.close(saved)
        captured.append(os.pread(capture.fileno(), 1 << 16, 0).decode(errors='replace'))


# The roidb fields a training worker needs (Mask R-CNN adds 'segms', Keypoint R-CNN 'gt_keypoints', a Fast
# R-CNN PROPOSAL_KEYS); the rest stays behind.
TRAINING_KEYS = ('image', 'flipped', 'height', 'width', 'boxes', 'gt_classes', 'is_crowd')
PROPOSAL_KEYS = ('max_overlaps',)


def _is_truncated_jpeg(data):
    """Whether the bytes `data` are a JPEG whose data stops before the end-of-image marker.

    The header segments are skipped by their lengths up to the first start-of-scan, so that an EXIF
    thumbnail's own end marker does not count; after it, an end marker can only be the image's own
    (entropy-coded data stuffs every 0xFF byte), and bytes after it (some cameras append data) are fine.
    """
    if not data.startswith(_JPEG_SOI):
        return False
    pos = len(_JPEG_SOI)
    while pos + 4 <= len(data) and data[pos] == 0xFF:
        marker = data[pos + 1]
        if marker == 0xFF:  # fill byte before a marker
            pos += 1
        elif marker in _JPEG_STANDALONE:
            pos += 2
        elif marker == _JPEG_SOS:
            return data.rfind(_JPEG_EOI, pos) < 0  # from the end: found at once in a whole file
        else:
            pos += 2 + int.from_bytes(data[pos + 2:pos + 4], 'big')
    return pos + 4 > len(data)  # the file ends inside the header segments


def gt_targets(entry):
    """Ground-truth rows (gt_classes > 0) of a roidb entry as the model's target dict; with 'segms'
    in the entry (Mask R-CNN) also the non-crowd rows' polygons as tensors that travel with the
    boxes to the training device (mask_rcnn.mask_targets): 'segm_boxes' (G, 4) float32, their tight
    boxes (segms.polys_to_boxes), and 'segm_edges', 'segm_polygon_edges', 'segm_object_polygons'
    (segms.packed_polygons), coordinates as float32 in the original image (flipped with the entry), and
    the ints 'segm_most_edges' and 'segm_most_polygons' (polygon_targets); with 'max_overlaps' in the
    entry (a Fast R-CNN's roidb of proposal files) 'proposals' (P, 4) float32, the proposals it can
    sample (proposal_files.proposal_rows)."""
    is_gt = np.asarray(entry['gt_classes']) > 0
    targets = {
        'boxes': torch.from_numpy(np.asarray(entry['boxes'], dtype=np.float32).reshape(-1, 4)[is_gt]),
        'classes': torch.from_numpy(np.asarray(entry['gt_classes'], dtype=np.int64)[is_gt]),
        'is_crowd': torch.from_numpy(np.asarray(entry['is_crowd'], dtype=bool)[is_gt]),
    }
    if 'gt_keypoints' in entry:  # Keypoint R-CNN: the gt rows' (x, y, v) keypoints, float32 (G, 3, K)
        # A Fast R-CNN's proposal rows follow the gt rows, without keypoints (Detectron's merged roidb).
        keypoints = np.asarray(entry['gt_keypoints'], dtype=np.float32)
        targets['keypoints'] = torch.from_numpy(keypoints[is_gt[:len(keypoints)]])
    if 'max_overlaps' in entry:
        targets['proposals'] = torch.from_numpy(proposal_rows(entry))
    if 'segms' in entry:
        targets.update(polygon_targets([segm for segm, crowd, keep in zip(entry['segms'], entry['is_crowd'], is_gt)
                                        if keep and not crowd]))
    return targets


def polygon_targets(polys):
    """The targets of objects given as polygon lists (gt_targets): their tensors, and as host ints the
    most edges and the most polygons of one object, which size the fixed-size mask targets without
    waiting for the device (mask_rcnn.mask_targets' max_rows)."""
    polys = [[np.asarray(p, dtype=np.float32) for p in poly] for poly in polys]
    edges, polygon_edges, object_polygons = segm_utils.packed_polygons(polys)
    return {'segm_boxes': torch.from_numpy(segm_utils.polys_to_boxes(polys)), 'segm_edges': edges,
            'segm_polygon_edges': polygon_edges, 'segm_object_polygons': object_polygons,
            'segm_most_edges': max([0] + [sum(len(p) // 2 for p in poly) for poly in polys]),
            'segm_most_polygons': max([0] + [len(poly) for poly in polys])}


def prepare_training_image(entry, target_size, max_size, pixel_means):
    """One entry at one training scale -> (float32 HxWx3 image, im_info float32 (3,), targets)."""
    im = _read_flipped(entry)
    ims, scales = prep_im_for_blob(im, pixel_means, [target_size], max_size)
    return ims[0], _training_im_info(im, scales[0]), gt_targets(entry)


def _read_flipped(entry):
    im = read_entry_image(entry)
    return im[:, ::-1, :] if entry['flipped'] else im


def read_entry_image(entry):
    """read_image of a roidb entry's 'image', checked against the entry's 'width' and 'height' (when it
    has them) by check_image_size: every model's training and test_net read images through this."""
    im = read_image(entry['image'])
    if 'height' in entry:
        check_image_size(im, entry)
    return im


def check_image_size(im, entry):
    """The decoded image must have the width and height of its annotation record: the boxes were clipped
    to that size and are flipped about it, and the detections are scored against them, so another size
    trains or scores boxes off the objects."""
    height, width = im.shape[:2]
    if (entry['height'], entry['width']) != (height, width):
        raise DatasetError(
            "Image '{}' is {} x {} pixels (width x height) but its record in the annotation file says {} x {}; "
            "{}".format(entry['image'], width, height, entry['width'], entry['height'],
                        _size_advice(entry['image'], (height, width), (entry['height'], entry['width']))))


def _size_advice(path, decoded, recorded):
    """What to fix: the record, unless the file's EXIF orientation turns it to the recorded size (its
    annotations were then made on the turned view, not on the stored pixels that COCO's tools read)."""
    orientation = _exif_orientation(path)
    if orientation in (5, 6, 7, 8) and decoded[::-1] == recorded:
        return ("its EXIF orientation tag ({}) turns it to the record's size, but images are read as stored, as "
                "COCO's annotations are; if the boxes were drawn on the turned view, store the image turned "
                "(e.g. PIL.ImageOps.exif_transpose) without the tag, do not swap the record's width and "
                "height".format(orientation))
    return "fix the image's width and height there (or the image)"


def _exif_orientation(path):
    try:
        from PIL import Image
        with Image.open(path) as image:
            return image.getexif().get(0x0112)
    except Exception:  # any failure: only the advice of an error already raised depends on it
        return None


def _training_im_info(im, scale):
    # Training im_info is the unpadded scaled size (Detectron's RPN targets round h*s and w*s).
    return np.array([np.round(im.shape[0] * scale), np.round(im.shape[1] * scale), scale], dtype=np.float32)


def prepare_training_entry(entry, rng, scales, max_size, pixel_means):
    """One entry at a training scale drawn from `scales` with rng (a RandomState owned by this
    (iteration, entry) draw, see loader.TrainingDataset)."""
    return prepare_training_image(entry, drawn_scale(scales, rng), max_size, pixel_means)


def drawn_scale(scales, rng):
    """The training scale of a sample: one draw of rng."""
    return scales[rng.randint(len(scales))]


def prepare_unresized_training_entry(entry, rng, scales, max_size):
    """prepare_training_entry for a device that resizes (UnresizedImages): the same draw, the image
    read and flipped but left uint8 at its size -> (uint8 HxWx3 image, its scale, im_info, targets)."""
    target_size = drawn_scale(scales, rng)
    im = np.ascontiguousarray(_read_flipped(entry))
    scale = resize_scale(im.shape[0], im.shape[1], target_size, max_size)
    return im, scale, _training_im_info(im, scale), gt_targets(entry)


class UnresizedImages:
    """A training batch's images as the loader leaves them for the device to finish
    (blob.images_blob_t): BGR uint8 (H, W, 3) tensors, flipped, each with its scale (a float).
    A 640x480 image travels as 0.9 MB instead of 11.7 MB of float32 blob; from a loader worker in the
    batch's one shared tensor (loader.packed_leaves, through map_leaves), which DataLoader's pin thread
    pins for asynchronous uploads (pin_memory, without workers)."""

    def __init__(self, images, scales):
        self.images = images
        self.scales = scales

    def map_leaves(self, fn):
        """The same scales with fn applied to each image (the loader's packing and unpacking)."""
        return UnresizedImages([fn(image) for image in self.images], self.scales)

    def pin_memory(self):
        return self.map_leaves(torch.Tensor.pin_memory)


def collate_unresized(items):
    """prepare_unresized_training_entry's items -> (UnresizedImages, im_info (B, 3), list of B
    target dicts), the images' tensors sharing the items' arrays (a loader worker packs them)."""
    ims, scales, im_infos, targets = zip(*items)
    images = UnresizedImages([torch.from_numpy(im) for im in ims], list(scales))
    return images, torch.from_numpy(np.stack(im_infos)), list(targets)


def collate_minibatch(items, stride):
    """Prepared images -> (images (B, 3, H, W), im_info (B, 3), list of B target dicts), torch."""
    ims, im_infos, targets = zip(*items)
    # Written straight into the tensor that travels (shared memory in a loader worker).
    images = empty_for_main_process(blob_shape(ims, stride), torch.float32)
    fill_blob(images.numpy(), ims)
    return images, torch.from_numpy(np.stack(im_infos)), list(targets)
