"""torchvision's models as they ship, from their builders (no weights), 10 classes, each
selected as `torchvision_models.py:build_NAME` (the model file's FILE:FUNCTION form):
2 x 3 x 64 x 64 images, cross entropy against fixed labels.  Needs torchvision (its PyPI
wheel needs a CUDA build of torch: it does not import beside the CPU torch `make` installs)."""

import torch
import torch.nn.functional as F
import torchvision


def _build(name: str, **options):
    torch.manual_seed(0)
    return getattr(torchvision.models, name)(num_classes=10, **options).train()


def build_resnet50():
    return _build("resnet50")


def build_densenet121():
    return _build("densenet121")


def build_mobilenet_v3_small():
    return _build("mobilenet_v3_small")


def build_efficientnet_b0():
    return _build("efficientnet_b0")


def build_efficientnet_v2_s():
    return _build("efficientnet_v2_s")  # more blocks than rotor's max_blocks (40), in 8 stages


def build_convnext_tiny():
    return _build("convnext_tiny")


def build_regnet_y_400mf():
    return _build("regnet_y_400mf")  # module names such as `block1-0`


def build_googlenet():
    return _build("googlenet", aux_logits=False, init_weights=True)


def build_vit_b_16():
    return _build("vit_b_16", image_size=64)


def build_swin_t():
    return _build("swin_t")


def sample_inputs():
    return (torch.randn(2, 3, 64, 64, generator=torch.Generator().manual_seed(1)),)


LABELS = torch.tensor([3, 7])


def loss_fn(output):
    return F.cross_entropy(output, LABELS)
