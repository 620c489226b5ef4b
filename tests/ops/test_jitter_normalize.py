"""CenterNet's training colour jitter and normalisation on the device: ops.jitter_normalize's Triton
kernels (compiled on a CUDA machine, else run by Triton's interpreter in a subprocess) against the
loader workers' numpy arithmetic (roi_data.centernet.normalised_input)."""
import itertools

import numpy as np
import pytest
import torch
from triton_subprocess import tensor_kernel_results

from detectron.roi_data import centernet as cn

_KERNEL_SCRIPT = '''
import sys
import torch
from detectron.ops import jitter_normalize
from detectron.roi_data.centernet import CONTRAST, SATURATION
results = {}
for name, (images, order, alphas, lighting, mean, std) in torch.load(sys.argv[1]).items():
    results[name] = (jitter_normalize.jitter_normalize(images, order, alphas, lighting, mean, std,
                                                       contrast=CONTRAST, saturation=SATURATION),)
torch.save(results, sys.argv[2])
'''


def _case(seed, height, width, contrast):
    """uint8 images, one per order of the three ops, their hand-made draws (the contrast's alpha given)
    and the workers' inputs for them."""
    rng = np.random.RandomState(seed)
    jitters = [cn.ColorJitter(order, tuple(contrast if op == 1 else rng.uniform(0.6, 1.4) for op in order),
                              rng.normal(scale=0.1, size=3)) for order in itertools.permutations(range(3))]
    images = rng.randint(0, 256, (len(jitters), height, width, 3)).astype(np.uint8)
    expected = np.stack([cn.normalised_input(im, cn.COCO_MEAN, cn.COCO_STD, j) for im, j in zip(images, jitters)])
    arrays = [cn.jitter_arrays(j) for j in jitters]
    inputs = (torch.from_numpy(images),) + tuple(torch.from_numpy(np.stack([a[k] for a in arrays]))
                                                 for k in ('jitter_order', 'jitter_alphas', 'jitter_lighting'))
    inputs += (torch.tensor(cn.COCO_MEAN, dtype=torch.float32), torch.tensor(cn.COCO_STD, dtype=torch.float32))
    return inputs, torch.from_numpy(expected)


@pytest.mark.cuda
@pytest.mark.processes
def test_kernels_give_the_workers_input_but_for_the_grey_mean(tmp_path):
    # With the contrast's alpha 1 the grey mean (summed in another order) counts for nothing: bit for bit
    # the workers' values. With another alpha, within a rounding of the mean. 40 x 64 and 23 x 96 pixels
    # end in part-filled blocks; the widths are multiples of 16, as the 512 px of the configs, where cv2
    # converts every pixel to grey with its vector code (its scalar code for a row's last few pixels
    # of other widths rounds differently).
    cases = {'{}x{}-contrast{}'.format(h, w, contrast): _case(seed, h, w, contrast)
             for seed, (h, w) in enumerate([(40, 64), (23, 96)]) for contrast in (1.0, 1.3)}
    results = tensor_kernel_results(_KERNEL_SCRIPT, {name: inputs for name, (inputs, _) in cases.items()}, tmp_path,
                                    skip_reason='needs triton (ships with CUDA builds of torch)')
    for name, (_, expected) in cases.items():
        got, = results[name]
        assert got.dtype == torch.float32 and got.shape == expected.shape and got.is_contiguous(), name
        if name.endswith('contrast1.0'):
            assert torch.equal(got, expected), name
        else:
            difference = (got - expected).abs().max().item()
            assert 0 < difference < 1e-5, name   # float32 sums of the grey values in another order
