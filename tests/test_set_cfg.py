"""The test helpers that change the global cfg (tests/conftest.py) give every value back."""
import pytest

from detectron.core.config import cfg


def test_set_cfg_sets_dotted_keys_and_restore_gives_them_back(set_cfg, restore_global_cfg):
    before = (cfg.MODEL.NUM_CLASSES, cfg.MRCNN.THRESH_BINARIZE, cfg.STD_NMS)
    set_cfg({'MODEL.NUM_CLASSES': 4, 'MRCNN.THRESH_BINARIZE': 0.6, 'STD_NMS': not cfg.STD_NMS})
    assert (cfg.MODEL.NUM_CLASSES, cfg.MRCNN.THRESH_BINARIZE, cfg.STD_NMS) == (4, 0.6, not before[2])
    restore_global_cfg()
    assert (cfg.MODEL.NUM_CLASSES, cfg.MRCNN.THRESH_BINARIZE, cfg.STD_NMS) == before
    assert 'THRESH_BINARIZE' in cfg.MRCNN


def test_set_cfg_refuses_a_name_that_is_no_key(set_cfg):
    with pytest.raises(KeyError, match='MRCNN.THRESH_BINARISE is not a cfg key'):
        set_cfg({'MRCNN.THRESH_BINARISE': 0.6})
    assert 'THRESH_BINARISE' not in cfg.MRCNN


def test_restore_gives_back_a_removed_key_and_drops_an_added_one(restore_global_cfg):
    value = cfg.MRCNN.THRESH_BINARIZE
    del cfg.MRCNN['THRESH_BINARIZE']
    dict.__setitem__(cfg.MRCNN, 'EXTRA', 1)
    restore_global_cfg()
    assert cfg.MRCNN.THRESH_BINARIZE == value and 'EXTRA' not in cfg.MRCNN
