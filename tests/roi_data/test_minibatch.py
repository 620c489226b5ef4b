import cv2
import numpy as np
import pytest
import torch

from detectron.roi_data.loader import scale_rng
from detectron.roi_data.minibatch import (collate_minibatch, gt_targets, prepare_training_entry,
                                          prepare_unresized_training_entry, read_image)
from detectron.utils.errors import DatasetError

PIXEL_MEANS = (102.9801, 115.9465, 122.7717)


def _entry(path, height, width, boxes=((0, 0, 1, 1),), classes=(1,), crowd=(False,), flipped=False):
    return {'image': str(path), 'height': height, 'width': width, 'flipped': flipped,
            'boxes': np.array(boxes, dtype=np.float32).reshape(-1, 4),
            'gt_classes': np.array(classes, dtype=np.int32),
            'is_crowd': np.array(crowd, dtype=bool)}


def _minibatch(entries, target_size, max_size, pixel_means, stride):
    """The loader's batch of entries at one training scale, as rcnn_builder composes it
    (prepare_training_entry per image, then collate_minibatch)."""
    rng = np.random.RandomState(0)
    return collate_minibatch([prepare_training_entry(entry, rng, (target_size,), max_size, pixel_means)
                              for entry in entries], stride)


def _write(path, im):
    assert cv2.imwrite(str(path), im)
    return path


def test_read_image_returns_bgr_pixels(tmp_path):
    im = np.zeros((5, 7, 3), dtype=np.uint8)
    im[..., 0], im[..., 2] = 10, 250   # blue 10, red 250
    read = read_image(str(_write(tmp_path / 'a.png', im)))
    assert read.dtype == np.uint8
    np.testing.assert_array_equal(read, im)


def test_read_image_missing_file_names_it(tmp_path):
    path = str(tmp_path / 'missing.jpg')
    with pytest.raises(DatasetError, match='missing.jpg'):
        read_image(path)


def _jpeg_bytes(height, width, seed=0, params=()):
    image = np.random.RandomState(seed).randint(0, 256, (height, width, 3)).astype(np.uint8)
    ok, data = cv2.imencode('.jpg', image, list(params))
    assert ok
    return data.tobytes()


def _with_exif_thumbnail(jpeg):
    """jpeg with an APP1 segment holding a small JPEG, whose own end-of-image marker comes first."""
    payload = b'Exif\x00\x00' + _jpeg_bytes(8, 8, seed=1)
    return jpeg[:2] + b'\xff\xe1' + (len(payload) + 2).to_bytes(2, 'big') + payload + jpeg[2:]


@pytest.mark.parametrize('kind', ['baseline', 'progressive', 'with EXIF thumbnail'])
def test_a_truncated_jpeg_is_refused_with_its_name(tmp_path, kind):
    jpeg = _jpeg_bytes(96, 128, params=(cv2.IMWRITE_JPEG_PROGRESSIVE, 1) if kind == 'progressive' else ())
    if kind == 'with EXIF thumbnail':
        jpeg = _with_exif_thumbnail(jpeg)
    complete, truncated = tmp_path / 'complete.jpg', tmp_path / 'truncated.jpg'
    complete.write_bytes(jpeg + b'trailing bytes some cameras append')
    truncated.write_bytes(jpeg[:len(jpeg) * 3 // 4])
    assert read_image(str(complete)).shape == (96, 128, 3)
    assert cv2.imread(str(truncated)) is not None  # libjpeg decodes it, with grey rows and a warning
    with pytest.raises(DatasetError) as err:
        read_image(str(truncated))
    assert str(err.value) == (
        "Image '{}' is a truncated JPEG (it ends before its end-of-image marker, e.g. an interrupted download or "
        "copy); restore the file or remove it from the dataset.".format(truncated))


def _with_exif_orientation(jpeg, orientation):
    """jpeg with an APP1 EXIF segment whose only tag is Orientation (0x0112, one SHORT)."""
    tiff = (b'II*\x00' + (8).to_bytes(4, 'little') + (1).to_bytes(2, 'little') + (0x0112).to_bytes(2, 'little')
            + (3).to_bytes(2, 'little') + (1).to_bytes(4, 'little') + orientation.to_bytes(4, 'little')
            + (0).to_bytes(4, 'little'))
    payload = b'Exif\x00\x00' + tiff
    return jpeg[:2] + b'\xff\xe1' + (len(payload) + 2).to_bytes(2, 'big') + payload + jpeg[2:]


def test_read_image_decodes_the_stored_pixels_ignoring_exif_orientation(tmp_path):
    # Orientation 6 (rotate 90 degrees clockwise to display): cv2.imread would turn the 48 x 64 image to
    # 64 x 48; COCO's annotations (and the json's width and height) are of the stored pixels.
    plain, rotated = tmp_path / 'plain.jpg', tmp_path / 'rotated.jpg'
    plain.write_bytes(_jpeg_bytes(48, 64, seed=3, params=(cv2.IMWRITE_JPEG_PROGRESSIVE, 1)))
    rotated.write_bytes(_with_exif_orientation(_jpeg_bytes(48, 64, seed=3), 6))
    png = _write(tmp_path / 'c.png', np.random.RandomState(4).randint(0, 256, (9, 11, 3)).astype(np.uint8))
    for path in (plain, rotated, png):
        np.testing.assert_array_equal(read_image(str(path)),
                                      cv2.imread(str(path), cv2.IMREAD_COLOR | cv2.IMREAD_IGNORE_ORIENTATION))
    assert cv2.imread(str(rotated)).shape == (64, 48, 3)  # what Detectron's reader gives
    # The same pixels as the file without the tag.
    untagged = cv2.imdecode(np.frombuffer(_jpeg_bytes(48, 64, seed=3), np.uint8), cv2.IMREAD_COLOR)
    np.testing.assert_array_equal(read_image(str(rotated)), untagged)


@pytest.mark.parametrize('kind', ['empty file', 'directory'])
def test_read_image_unreadable_path_names_it(tmp_path, kind):
    path = tmp_path / 'im.jpg'
    if kind == 'directory':
        path.mkdir()
    else:
        path.write_bytes(b'')
    with pytest.raises(DatasetError) as info:
        read_image(str(path))
    assert str(info.value) == ("Cannot read image '{}': the file is missing, unreadable or not a valid image; "
                               "restore it or remove it from the dataset.".format(path))


def test_read_image_corrupt_file_names_it(tmp_path):
    path = tmp_path / 'corrupt.jpg'
    path.write_bytes(b'this is not a jpeg')
    with pytest.raises(DatasetError) as info:
        read_image(str(path))
    assert str(path) in str(info.value)


def test_flipped_pixels_match_flipped_boxes(tmp_path):
    # A bright rectangle covering columns 5..19 and rows 10..29 (inclusive) of a 48x64 image.
    im = np.zeros((48, 64, 3), dtype=np.uint8)
    im[10:30, 5:20] = 255
    path = _write(tmp_path / 'rect.png', im)
    # Detectron's roidb flip: x1' = W - x2 - 1 = 64 - 19 - 1, x2' = W - x1 - 1 = 64 - 5 - 1.
    entry = _entry(path, 48, 64, boxes=[(44, 10, 58, 29)], flipped=True)
    images, im_info, targets = _minibatch([entry], 48, 1000, np.zeros(3), 1)
    assert im_info[0].tolist() == [48, 64, 1.0]
    bright = (images[0] == 255).all(dim=0)
    x1, y1, x2, y2 = targets[0]['boxes'][0].int().tolist()
    assert (x1, y1, x2, y2) == (44, 10, 58, 29)
    assert bright[y1:y2 + 1, x1:x2 + 1].all()
    assert bright.sum() == (x2 - x1 + 1) * (y2 - y1 + 1)


def test_training_im_info_is_unpadded_scaled_size(tmp_path):
    path = _write(tmp_path / 'black.png', np.zeros((333, 500, 3), dtype=np.uint8))
    images, im_info, _ = _minibatch([_entry(path, 333, 500)], 600, 1000, PIXEL_MEANS, 32)
    scale = 600 / 333
    # 333 * s = 600 and 500 * s = 900.9 -> 901; the blob is padded to 608 x 928.
    assert im_info.dtype == torch.float32
    torch.testing.assert_close(im_info, torch.tensor([[600.0, 901.0, scale]]), rtol=0, atol=1e-6)
    assert images.shape == (1, 3, 608, 928)
    assert images.dtype == torch.float32
    # Black pixels become -mean in BGR order inside the image; the padding stays zero.
    expected = -torch.tensor(PIXEL_MEANS, dtype=torch.float32).view(3, 1, 1).expand(3, 600, 901)
    torch.testing.assert_close(images[0, :, :600, :901], expected, rtol=0, atol=1e-4)
    assert not images[0, :, 600:, :].any()
    assert not images[0, :, :, 901:].any()


def test_batch_is_padded_to_largest_image(tmp_path):
    wide = _write(tmp_path / 'wide.png', np.zeros((40, 100, 3), dtype=np.uint8))
    tall = _write(tmp_path / 'tall.png', np.zeros((90, 30, 3), dtype=np.uint8))
    entries = [_entry(wide, 40, 100), _entry(tall, 90, 30)]
    images, im_info, targets = _minibatch(entries, 20, 1000, PIXEL_MEANS, 32)
    # wide: scale 0.5 -> 20 x 50; tall: scale 2/3 -> 60 x 20; padded to 64 x 64.
    assert images.shape == (2, 3, 64, 64)
    torch.testing.assert_close(im_info, torch.tensor([[20.0, 50.0, 0.5], [60.0, 20.0, 2 / 3]]))
    assert len(targets) == 2


def test_targets_keep_only_gt_rows_with_contract_dtypes():
    entry = {'boxes': np.array([[1, 2, 3, 4], [5, 6, 7, 8], [0, 0, 9, 9]], dtype=np.float32),
             'gt_classes': np.array([3, 0, 7], dtype=np.int32),
             'is_crowd': np.array([False, False, True])}
    targets = gt_targets(entry)
    assert targets['boxes'].dtype == torch.float32
    assert targets['classes'].dtype == torch.int64
    assert targets['is_crowd'].dtype == torch.bool
    assert targets['boxes'].tolist() == [[1, 2, 3, 4], [0, 0, 9, 9]]
    assert targets['classes'].tolist() == [3, 7]
    assert targets['is_crowd'].tolist() == [False, True]


def test_targets_of_an_image_without_gt_are_empty():
    entry = {'boxes': np.zeros((0, 4), dtype=np.float32), 'gt_classes': np.zeros(0, dtype=np.int32),
             'is_crowd': np.zeros(0, dtype=bool)}
    targets = gt_targets(entry)
    assert targets['boxes'].shape == (0, 4)
    assert targets['classes'].shape == (0,)


def _two_entries(tmp_path):
    rng = np.random.RandomState(7)
    return [_entry(_write(tmp_path / 'a.png', rng.randint(0, 256, (37, 61, 3)).astype(np.uint8)), 37, 61,
                   boxes=((2, 3, 20, 30),)),
            _entry(_write(tmp_path / 'b.png', rng.randint(0, 256, (50, 29, 3)).astype(np.uint8)), 50, 29,
                   boxes=((1, 1, 9, 9), (4, 5, 20, 40)), classes=(2, 3), crowd=(False, True), flipped=True)]



def test_unresized_images_are_flipped_before_the_resize(tmp_path):
    entry = _two_entries(tmp_path)[1]
    im, scale, im_info, _ = prepare_unresized_training_entry(entry, scale_rng(0, 0, 0), (60,), 1000)
    np.testing.assert_array_equal(im, read_image(entry['image'])[:, ::-1, :])
    assert scale == 60 / 29
    np.testing.assert_array_equal(im_info, np.array([np.round(50 * scale), np.round(29 * scale), scale], np.float32))
