"""CenterNet training losses: the L1 losses against loops and CtdetLoss by hand (derivations in the comments)."""
import math

import pytest
import torch

from detectron.modeling import centernet_losses


# ------------------------------------------------------------------------------------------------
# losses
# ------------------------------------------------------------------------------------------------

def _reg_batch(seed=0):
    gen = torch.Generator().manual_seed(seed)
    output = torch.randn(2, 2, 4, 5, generator=gen)
    mask = torch.tensor([[1, 1, 0, 0], [0, 1, 0, 1]], dtype=torch.uint8)
    ind = torch.tensor([[3, 19, 5, 0], [0, 7, 8, 12]])
    target = torch.randn(2, 4, 2, generator=gen)   # also non-zero in masked-out slots
    return output, mask, ind, target


def test_reg_l1_loss_against_loop():
    output, mask, ind, target = _reg_batch()
    total, count = 0.0, 0
    for b in range(2):
        for m in range(4):
            if mask[b, m]:
                y, x = divmod(ind[b, m].item(), 5)
                total += (output[b, :, y, x] - target[b, m]).abs().sum().item()
                count += 1
    expected = total / (2 * count + 1e-4)   # mask expanded to 2 channels: 2 x #objects
    assert centernet_losses.reg_l1_loss(output, mask, ind, target).item() == pytest.approx(expected, rel=1e-6)


def test_reg_weighted_l1_loss_uses_the_channel_mask_as_given():
    output, _, ind, target = _reg_batch(1)
    mask = torch.tensor([[[1, 0], [1, 1], [0, 0], [0, 0]], [[0, 0], [0, 1], [0, 0], [0, 0]]],
                        dtype=torch.uint8)
    total = 0.0
    for b, m, k in mask.nonzero().tolist():
        y, x = divmod(ind[b, m].item(), 5)
        total += abs(output[b, k, y, x].item() - target[b, m, k].item())
    expected = total / (4 + 1e-4)
    assert centernet_losses.reg_weighted_l1_loss(output, mask, ind, target).item() == pytest.approx(expected, rel=1e-6)


def _ctdet_batch():
    hm = torch.zeros(1, 2, 4, 5)
    hm[0, 1, 2, 3] = 1
    hm[0, 1, 2, 2] = 0.5
    return {'hm': hm, 'reg_mask': torch.tensor([[1, 0]], dtype=torch.uint8),
            'ind': torch.tensor([[13, 0]]), 'wh': torch.tensor([[[6.0, 4.0], [9.0, 9.0]]]),
            'reg': torch.tensor([[[0.25, 0.5], [0.0, 0.0]]])}


def test_ctdet_loss_by_hand():
    logits = torch.full((1, 2, 4, 5), -20.0)   # clamped to p = 1e-4 everywhere
    logits[0, 1, 2, 2] = 0.0                   # p = 0.5 at the gt 0.5 neighbour
    wh = torch.zeros(1, 2, 4, 5)
    wh[0, :, 2, 3] = torch.tensor([5.0, 5.0])  # |5 - 6| + |5 - 4| = 2
    reg = torch.zeros(1, 2, 4, 5)              # |0 - 0.25| + |0 - 0.5| = 0.75
    outputs = {'hm': logits, 'wh': wh, 'reg': reg}
    losses = centernet_losses.ctdet_loss(outputs, _ctdet_batch())
    # positive: log(1e-4) (1 - 1e-4)^2 (the clamp, not log(sigmoid(-20)) = -20); the 38 other
    # negatives at p = 1e-4, gt 0: log(1 - 1e-4) 1e-8; the neighbour: log(0.5) 0.25 0.5^4.
    pos = math.log(1e-4) * (1 - 1e-4) ** 2
    neg = 38 * math.log(1 - 1e-4) * 1e-8 + math.log(0.5) * 0.25 * 0.0625
    hm_loss = -(pos + neg)
    assert losses['hm_loss'].item() == pytest.approx(hm_loss, rel=1e-5)
    assert losses['wh_loss'].item() == pytest.approx(2 / (2 + 1e-4), rel=1e-6)
    assert losses['off_loss'].item() == pytest.approx(0.75 / (2 + 1e-4), rel=1e-6)
    assert losses['loss'].item() == pytest.approx(
        hm_loss + 0.1 * 2 / (2 + 1e-4) + 0.75 / (2 + 1e-4), rel=1e-5)
    assert [k for k in losses if k.startswith('loss')] == ['loss']
    assert torch.equal(outputs['hm'], logits) and logits[0, 0, 0, 0] == -20.0   # not modified


def test_ctdet_loss_options_skip_terms_and_backpropagate():
    batch = _ctdet_batch()
    del batch['reg']
    logits = torch.zeros(1, 2, 4, 5, requires_grad=True)
    wh = torch.zeros(1, 2, 4, 5, requires_grad=True)
    losses = centernet_losses.ctdet_loss({'hm': logits, 'wh': wh}, batch, hm_weight=2, wh_weight=0.5,
                           reg_offset=False)
    assert losses['off_loss'].item() == 0
    torch.testing.assert_close(losses['loss'], 2 * losses['hm_loss'] + 0.5 * losses['wh_loss'])
    losses['loss'].backward()
    assert logits.grad.abs().sum() > 0 and wh.grad[0, :, 2, 3].abs().sum() > 0
    no_wh = centernet_losses.ctdet_loss({'hm': logits.detach()}, batch, wh_weight=0, reg_offset=False)
    assert no_wh['wh_loss'].item() == 0 and no_wh['loss'].item() == pytest.approx(no_wh['hm_loss'].item())


def test_ctdet_loss_cat_spec_wh():
    batch = _ctdet_batch()
    batch['cat_spec_wh'] = torch.tensor([[[0, 0, 6.0, 4.0], [0, 0, 0, 0]]])
    batch['cat_spec_mask'] = torch.tensor([[[0, 0, 1, 1], [0, 0, 0, 0]]], dtype=torch.uint8)
    wh = torch.zeros(1, 4, 4, 5)
    wh[0, 2:4, 2, 3] = torch.tensor([5.0, 5.0])
    losses = centernet_losses.ctdet_loss({'hm': torch.zeros(1, 2, 4, 5), 'wh': wh, 'reg': torch.zeros(1, 2, 4, 5)},
                           batch, cat_spec_wh=True)
    assert losses['wh_loss'].item() == pytest.approx(2 / (2 + 1e-4), rel=1e-6)
