"""CenterNet's batch: collate_samples stacks the prepared samples' arrays key by key, the heatmaps as
their nonzero entries, which the model scatters back."""
import numpy as np
import pytest
import torch

from detectron.modeling.centernet import CenterNet, heatmap_index_dtype, with_dense_heatmap
from detectron.modeling.centernet_backbones import build_centernet_backbone
from detectron.modeling.centernet_builder import collate_samples
from detectron.modeling.centernet_heads import CenterNetHeads
from detectron.roi_data import centernet as cn


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
