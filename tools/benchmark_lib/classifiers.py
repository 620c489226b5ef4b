"""Box classifiers biased so that a chosen number of candidates reaches post-processing."""
import numpy as np
import torch

from detectron.utils.errors import ConfigValueError

from .timing import capture

# The inference cases: a 6-class model, 5 foreground classes. "Loaded": every RoI scores 0.18 on
# each of them (softmax 0.1 background), so 1000 RoIs x 5 classes reach post-processing.
TEST_NUM_CLASSES = 6


LOADED_CLASSES = 5


LOADED_SCORE = 0.18


UNLOADED_PROB = 1e-9  # classes beyond the loaded ones (81-class weights of the loops section)


def loaded_class_probs(num_classes, num_loaded=LOADED_CLASSES, score=LOADED_SCORE):
    """Softmax target of the loaded case: classes 1..num_loaded (at most all foreground classes)
    `score`, background the rest, any further class (nearly) 0."""
    num_loaded = min(num_loaded, num_classes - 1)
    background = 1.0 - num_loaded * score
    if num_loaded < 1 or background <= 0:
        raise ConfigValueError('the loaded case needs 2 or more classes and {} x {} < 1'.format(num_loaded, score))
    probs = np.full(num_classes, UNLOADED_PROB)
    probs[0] = background
    probs[1:num_loaded + 1] = score
    return probs


def realistic_class_head(features, num_classes, per_class, score_thresh, seed=0):
    """(weight, bias) of a box classifier under which about per_class RoIs of every foreground
    class score above score_thresh on these box-head features (R, D).

    Each foreground logit is a random projection of the features scaled to unit spread, plus a
    common shift found by bisection (every foreground probability grows with the shift), so the
    candidates vary with the RoI as a trained model's do.
    """
    x = features.detach().double().cpu()
    gen = torch.Generator().manual_seed(seed)
    proj = torch.randn(x.shape[1], num_classes - 1, generator=gen, dtype=torch.float64)
    z = x @ proj
    mean, std = z.mean(0), z.std(0).clamp_min(1e-12)
    weight = torch.zeros(num_classes, x.shape[1], dtype=torch.float64)
    weight[1:] = (proj / std).T
    base = torch.zeros(num_classes, dtype=torch.float64)
    base[1:] = -mean / std
    foreground = torch.arange(num_classes) > 0
    target = per_class * (num_classes - 1)

    def candidates(shift):
        probs = torch.softmax(x @ weight.T + base + shift * foreground, dim=1)
        return int((probs[:, 1:] > score_thresh).sum())

    low, high = -60.0, 60.0
    for _ in range(60):
        mid = (low + high) / 2
        low, high = (mid, high) if candidates(mid) < target else (low, mid)
    return weight.float(), (base + high * foreground).float()


def set_box_classifier(cls_score, box_regressors, weight, bias):
    """Box classifier <- (weight, bias); regressors <- 0, so every class's box is its RoI and
    KL's sigmas are 1: post-processing sees exactly the candidates the classifier lets through."""
    with torch.no_grad():
        cls_score.weight.copy_(weight)
        cls_score.bias.copy_(bias)
        for layer in box_regressors:
            layer.weight.zero_()
            layer.bias.zero_()


def set_loaded_classifier(cls_score, box_regressors, num_classes):
    bias = torch.as_tensor(np.log(loaded_class_probs(num_classes)), dtype=torch.float32)
    set_box_classifier(cls_score, box_regressors, torch.zeros_like(cls_score.weight), bias)


def ours_box_layers(model):
    outs = model.box_outs
    return outs.cls_score, [layer for layer in (outs.bbox_pred, outs.bbox_pred_std) if layer is not None]


def calibrate_realistic(box_layers, box_head, run, per_class, score_thresh):
    """Bias this model's classifier so that about per_class RoIs per class pass score_thresh."""
    features = capture(box_head, run, lambda out: out.detach().float())
    per_class = min(per_class, features.shape[0] // 3)
    weight, bias = realistic_class_head(features, TEST_NUM_CLASSES, per_class, score_thresh)
    set_box_classifier(*box_layers, weight.to(features.device), bias.to(features.device))
