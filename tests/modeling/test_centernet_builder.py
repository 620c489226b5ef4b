"""CenterNet's batch: collate_samples stacks the prepared samples' arrays key by key."""
import numpy as np
import pytest
import torch

from detectron.modeling.centernet_builder import collate_samples
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
    assert sorted(targets) == sorted(set(samples[0]) - {'input'})
    for key, batch in targets.items():
        assert batch.dtype == torch.from_numpy(samples[0][key]).dtype, key
        assert batch.numpy().tobytes() == np.stack([s[key] for s in samples]).tobytes(), key
    assert targets['hm'].shape == (3, 3, 16, 24) and targets['ind'].dtype == torch.int64
    assert targets['reg_mask'].dtype == torch.uint8
    assert targets['hm'][:, 1].sum() == 0 and targets['hm'][:, 0].amax() == 1   # classes 0 and 2 drawn
