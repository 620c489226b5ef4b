"""CenterNet (ctdet) output heads: CenterNet's models/networks (head layout and initialisation).

Their training losses are centernet_losses.py; decoding and post-processing, centernet_decode.py.
"""

from torch import nn

from detectron.utils.errors import ConfigValueError

# Prior 0.1 for the heatmap logits: -log((1 - 0.1) / 0.1) ~ -2.19, the value CenterNet writes.
HM_BIAS = -2.19
_HEAD_WEIGHT_STD = 0.001


# ------------------------------------------------------------------------------------------------
# Heads
# ------------------------------------------------------------------------------------------------

def _init_resdcn(head, name, classes):
    """resnet_dcn.py: hm keeps PyTorch's default init except the last bias; every conv of the other
    heads gets N(0, 0.001) weights and zero biases."""
    if 'hm' in name:
        _last_conv(head).bias.data.fill_(HM_BIAS)
        return
    for m in _convs(head):
        nn.init.normal_(m.weight, std=_HEAD_WEIGHT_STD)
        nn.init.constant_(m.bias, 0)


def _init_msra(head, name, classes):
    """msra_resnet.py (res_*): only convs with `classes` output channels are touched (the last one,
    unless head_conv equals classes): hm gets the bias, the others N(0, 0.001) weights and zero
    biases; the 3x3 conv keeps PyTorch's default init."""
    for m in _convs(head):
        if m.weight.shape[0] != classes:
            continue
        if 'hm' in name:
            nn.init.constant_(m.bias, HM_BIAS)
        else:
            nn.init.normal_(m.weight, std=_HEAD_WEIGHT_STD)
            nn.init.constant_(m.bias, 0)


def _init_dla(head, name, classes):
    """pose_dla_dcn.py: weights keep PyTorch's default init; hm's last bias is set, every bias of
    the other heads zeroed."""
    if 'hm' in name:
        _last_conv(head).bias.data.fill_(HM_BIAS)
        return
    for m in _convs(head):
        nn.init.constant_(m.bias, 0)


_HEAD_INITS = {'resdcn': _init_resdcn, 'msra': _init_msra, 'dla': _init_dla}


def _convs(head):
    return [m for m in head.modules() if isinstance(m, nn.Conv2d)]


def _last_conv(head):
    return _convs(head)[-1]


def _make_head(in_channels, classes, head_conv):
    if head_conv <= 0:
        return nn.Conv2d(in_channels, classes, kernel_size=1, stride=1, padding=0, bias=True)
    return nn.Sequential(
        nn.Conv2d(in_channels, head_conv, kernel_size=3, padding=1, bias=True),
        nn.ReLU(inplace=True),
        nn.Conv2d(head_conv, classes, kernel_size=1, stride=1, padding=0, bias=True))


class CenterNetHeads(nn.Module):
    """CenterNet's output heads on the stride-4 feature map.

    heads: {name: channels}, e.g. {'hm': 80, 'wh': 2, 'reg': 2}; each becomes an attribute of that
    name: Conv3x3(in_channels -> head_conv, bias) -> ReLU -> Conv1x1(-> channels, bias), so
    state-dict keys are 'hm.0.weight', 'hm.2.bias', ... as in CenterNet's checkpoints; head_conv
    <= 0 gives a single Conv1x1 ('hm.weight').
    init: which reference's head initialisation to reproduce: 'resdcn' (resdcn_*), 'msra' (res_*,
    which also builds its heads in sorted name order) or 'dla' (dla_*).
    forward(features) -> {name: raw output}; hm are logits (no sigmoid).
    """

    def __init__(self, in_channels, heads, head_conv, init):
        super().__init__()
        if init not in _HEAD_INITS:
            raise ConfigValueError('Unknown CenterNet head init {!r}; use one of {}.'
                                   .format(init, sorted(_HEAD_INITS)))
        self.heads = dict(heads)
        names = sorted(self.heads) if init == 'msra' else list(self.heads)
        for name in names:
            head = _make_head(in_channels, self.heads[name], head_conv)
            _HEAD_INITS[init](head, name, self.heads[name])
            setattr(self, name, head)

    def forward(self, features):
        return {name: getattr(self, name)(features) for name in self.heads}
