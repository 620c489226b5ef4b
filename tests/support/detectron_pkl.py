"""Detectron-named weight files built in a test: a narrow model of a shipped config, random blobs of its parameters'
shapes under Detectron's names, and the check that a .pkl of them loads every blob into its parameter (shared by
tests/checkpoint's Mask R-CNN and RetinaNet weight tests)."""
import os

import numpy as np
import torch

from detectron.checkpoint.c2_weights import load_weights, state_dict_to_detectron_blobs
from detectron.core.config import assert_and_infer_cfg, cfg, merge_cfg_from_file, merge_cfg_from_list
from detectron.modeling import model_builder
from detectron.utils.io import save_object

from tests.support.tiny_runs import REPO

R50_BLOCKS = {2: 3, 3: 4, 4: 6, 5: 3}


def model_of_config(relative_path, narrowing):
    """The model of configs/<relative_path> with the narrowing overrides (same layers and names, small files)."""
    merge_cfg_from_file(os.path.join(REPO, 'configs', relative_path))
    merge_cfg_from_list(narrowing)
    assert_and_infer_cfg()
    model = model_builder.create(cfg)
    cfg.defrost()
    return model


def r50_body_names(norm_names):
    """Detectron's blob names of the R-50 body; norm_names(prefix) -> the names of a norm after prefix's conv."""
    names = ['conv1_w']
    for stage, blocks in R50_BLOCKS.items():
        for block in range(blocks):
            for branch in ('branch2a', 'branch2b', 'branch2c') + (('branch1',) if block == 0 else ()):
                prefix = f'res{stage}_{block}_{branch}'
                names += [prefix + '_w'] + norm_names(prefix)
    return names


def random_blobs(model, names, norm='affine'):
    """Detectron's names with random values of each parameter's shape (the shapes looked up by our naming)."""
    rng = np.random.RandomState(0)
    shapes = {name: tuple(v.shape) for name, v in state_dict_to_detectron_blobs(model.state_dict(), norm).items()}
    return {name: rng.randn(*shapes[name]).astype(np.float32) for name in names}


def check_pkl_fills_every_parameter(model, blobs, path, hand_mapped):
    """Save blobs (with Detectron's `_momentum` copies) as a .pkl at path, load it into model: nothing missing or
    unused, the hand-mapped blobs in their keys, and every parameter holding exactly one blob's values."""
    save_object({'blobs': dict(blobs, **{n + '_momentum': v for n, v in blobs.items()})}, path)
    assert load_weights(model, path)[:2] == ([], [])
    state = model.state_dict()
    params = {k: v for k, v in state.items() if 'running_' not in k and 'num_batches' not in k}
    assert len(params) == len(blobs)
    for name, key in hand_mapped.items():
        assert torch.equal(state[key], torch.from_numpy(blobs[name])), name
    by_bytes = {v.tobytes(): n for n, v in blobs.items()}
    assert sorted(by_bytes[v.numpy().tobytes()] for v in params.values()) == sorted(blobs)
