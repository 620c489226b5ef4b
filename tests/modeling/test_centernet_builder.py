"""CenterNet's batch: collate_samples stacks the prepared samples' arrays key by key, the heatmaps as
their nonzero entries, which the model scatters back."""
import dataclasses
import functools
import itertools

import numpy as np
import pytest
import torch

from detectron.modeling.centernet import CenterNet, heatmap_index_dtype, normalize_training_images, with_dense_heatmap
from detectron.modeling.centernet_backbones import build_centernet_backbone
from detectron.modeling.centernet_builder import _batch_input, _batch_to_device, collate_samples
from detectron.modeling.centernet_heads import CenterNetHeads
from detectron.roi_data import centernet as cn
from detectron.roi_data.loader import TrainingDataset


def _samples(params, count=3):
    boxes = np.array([[4, 6, 40, 30], [20, 2, 60, 70]], np.float32)
    return [cn.ctdet_train_sample(np.random.RandomState(i).randint(0, 256, (80, 96, 3)).astype(np.uint8),
                                  boxes, np.array([0, 2]), np.random.RandomState(10 + i), params)
            for i in range(count)]


@pytest.mark.parametrize('layout', [dict(), dict(cat_spec_wh=True, reg_offset=False)])
def test_collate_samples_stacks_every_target_of_the_samples(layout):
    params = cn.CtdetParams(input_h=64, input_w=96, num_classes=3, max_objs=4, **layout)
    samples = _samples(params)
    images, targets = collate_samples(samples)
    assert images.dtype == torch.float32 and images.shape == (3, 3, 64, 96)
    assert images.numpy().tobytes() == np.stack([s['input'] for s in samples]).tobytes()
    assert sorted(targets) == sorted(set(samples[0]) - {'input', 'hm', 'hm_nonzero'} | {'hm_index', 'hm_value'})
    for key, batch in targets.items():
        if key.startswith('hm_'):
            continue
        assert batch.dtype == torch.from_numpy(samples[0][key]).dtype, key
        assert batch.numpy().tobytes() == np.stack([s[key] for s in samples]).tobytes(), key
    assert targets['ind'].dtype == torch.int64 and targets['reg_mask'].dtype == torch.uint8
    # The heatmaps as the nonzero entries of the stacked batch, in row-major order.
    dense = np.stack([s['hm'] for s in samples])
    assert dense.shape == (3, 3, 16, 24) and dense[:, 1].sum() == 0 and dense[:, 0].max() == 1  # classes 0, 2 drawn
    assert targets['hm_index'].dtype == torch.int32 and targets['hm_value'].dtype == torch.float32
    assert targets['hm_index'].tolist() == np.flatnonzero(dense).tolist()
    assert targets['hm_value'].numpy().tobytes() == dense[dense != 0].tobytes()
    scattered = with_dense_heatmap(targets, torch.empty(dense.shape))
    assert 'hm_index' not in scattered and 'hm_value' not in scattered
    assert scattered['hm'].numpy().tobytes() == dense.tobytes()


def test_sparse_heatmaps_give_the_dense_loss_bit_for_bit():
    params = cn.CtdetParams(input_h=64, input_w=96, num_classes=3, max_objs=4)
    samples = _samples(params)
    images, targets = collate_samples(samples)
    dense = dict(targets, hm=torch.from_numpy(np.stack([s['hm'] for s in samples])))
    del dense['hm_index'], dense['hm_value']
    torch.manual_seed(0)
    model = CenterNet(build_centernet_backbone('res_18'), CenterNetHeads(256, {'hm': 3, 'wh': 2, 'reg': 2}, 64, 'msra'))
    model.train()
    with torch.random.fork_rng():
        from_sparse = model(images, targets)
    from_dense = model(images, dense)
    for key in ('loss', 'hm_loss', 'wh_loss', 'off_loss'):
        assert from_sparse[key].item() == from_dense[key].item(), key
    assert from_sparse['hm_loss'].item() > 0


def test_heatmap_indices_are_int64_past_int32():
    assert heatmap_index_dtype(2 ** 31) == np.int32     # the last position, 2^31 - 1, fits
    assert heatmap_index_dtype(2 ** 31 + 1) == np.int64


def _on_device_pair(color_aug, count=4):
    """The same samples made both ways: the workers' float32 input, and the uint8 picture with its jitter."""
    boxes = np.array([[4, 6, 40, 30], [20, 2, 60, 70]], np.float32)
    params = cn.CtdetParams(input_h=64, input_w=96, num_classes=3, max_objs=4, color_aug=color_aug)
    images = [np.random.RandomState(i).randint(0, 256, (80, 96, 3)).astype(np.uint8) for i in range(count)]
    made = []
    for on_device in (False, True):
        p = dataclasses.replace(params, input_on_device=on_device)
        dataset = TrainingDataset([{'i': i} for i in range(count)], functools.partial(
            lambda entry, rng, out, p: cn.ctdet_train_sample(images[entry['i']], boxes, np.array([0, 2]), rng, p, out),
            p=p), seed=5, batch_input=_batch_input(p))
        made.append(dataset.__getitems__([(7, i) for i in range(count)]))
    return params, made


@pytest.mark.parametrize('color_aug', [True, False])
def test_inputs_normalised_on_the_device_equal_the_workers(color_aug):
    params, (floats, pictures) = _on_device_pair(color_aug)
    assert pictures[0]['input'].dtype == torch.uint8 and pictures[0]['input'].shape == (64, 96, 3)
    if color_aug:   # the draws differ from image to image, order included
        assert len({tuple(s['jitter_order']) for s in pictures}) > 1
    expected_images, expected_targets = collate_samples(floats)
    batch = collate_samples(pictures)
    assert len(batch) == 3 and batch[0]._base is None and batch[0] is pictures[0]['input']._base   # written in place
    images, targets = _batch_to_device(batch, torch.device('cpu'), params.mean, params.std)
    assert images.dtype == torch.float32 and images.is_contiguous() and images.shape == expected_images.shape
    for key in expected_targets:
        assert torch.equal(targets[key], expected_targets[key]), key
    difference = (images - expected_images).abs()
    if color_aug:   # the grey image's mean and cv2's grey conversion round apart
        assert difference.max() < 1e-5 and (difference == 0).float().mean() > 0.5
    else:
        assert difference.max() == 0
    # The uint8 picture is the workers' warp: normalised by the workers' own function it is their input.
    for floated, picture in zip(floats, pictures):
        jitter = cn.ColorJitter(tuple(picture['jitter_order'].tolist()), tuple(picture['jitter_alphas'].tolist()),
                                picture['jitter_lighting']) if color_aug else None
        again = cn.normalised_input(picture['input'].numpy(), params.mean, params.std, jitter)
        assert again.tobytes() == floated['input'].numpy().tobytes()


@pytest.mark.parametrize('device', ['cpu', pytest.param('cuda', marks=[pytest.mark.cuda, pytest.mark.skipif(
    not torch.cuda.is_available(), reason='needs CUDA')])])
def test_device_jitter_is_the_workers_bit_for_bit_but_for_the_grey_mean(device):
    # Hand-made draws, every order of the three ops: with the contrast's alpha 1 (the grey image's mean,
    # summed in another order on the device, then counts for nothing) the device's input is the
    # workers' bit for bit; with it, within a rounding of the mean.
    rng = np.random.RandomState(3)
    images = rng.randint(0, 256, (6, 40, 64, 3)).astype(np.uint8)   # widths of 16s, as cv2's vector code
    for contrast in (1.0, 1.3):
        jitters = [cn.ColorJitter(order, tuple(contrast if op == 1 else rng.uniform(0.6, 1.4) for op in order),
                                  rng.normal(scale=0.1, size=3)) for order in itertools.permutations(range(3))]
        expected = np.stack([cn.normalised_input(im, cn.COCO_MEAN, cn.COCO_STD, j) for im, j in zip(images, jitters)])
        arrays = [cn.jitter_arrays(j) for j in jitters]
        stacked = {k: torch.from_numpy(np.stack([a[k] for a in arrays])).to(device) for k in arrays[0]}
        got = normalize_training_images(torch.from_numpy(images).to(device), stacked, cn.COCO_MEAN, cn.COCO_STD)
        got = got.cpu().numpy()
        if contrast == 1.0:
            assert got.tobytes() == expected.tobytes()
        else:
            assert 0 < np.abs(got - expected).max() < 1e-5   # the grey values summed in another order
