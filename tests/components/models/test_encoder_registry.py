"""The built-in encoder names: each entry of the registry builds its own variant (conv stack or
none for images, whether a vector `obs` is taken), and each refuses what it cannot encode."""

from __future__ import annotations

import pytest
import torch

from sfbus_components.models.config import ModelConfig
from sfbus_components.models.encoders import (
    MlpEncoder,
    ObsEncoder,
    ResnetImpalaEncoder,
    StackEncoder,
)
from sfbus_components.models.parts import build_encoder
from sfbus_components.models.registry import ENCODERS

IMAGE = ((3, 36, 64), "uint8")
VECTOR = ((6,), "float32")


@pytest.mark.parametrize(("name", "image_branch", "stack"), [
    ("auto", StackEncoder, "conv_simple"),
    ("conv_simple", StackEncoder, "conv_simple"),
    ("nature_cnn", StackEncoder, "nature_cnn"),
    ("convnet_impala", StackEncoder, "convnet_impala"),
    ("resnet_impala", ResnetImpalaEncoder, None),
])
def test_each_image_encoder_name_builds_its_own_branch(name: str, image_branch: type,
                                                       stack: str | None) -> None:
    cfg = ModelConfig(encoder=name, hidden=32, precision="float32")
    encoder = build_encoder({"obs": IMAGE, "measurements": VECTOR}, cfg)
    assert isinstance(encoder, ObsEncoder)
    assert type(encoder.branches["obs"]) is image_branch
    assert getattr(encoder.branches["obs"], "stack", None) == stack
    assert isinstance(encoder.branches["measurements"], MlpEncoder)  # other keys: an MLP
    features = encoder({"obs": torch.zeros(2, *IMAGE[0], dtype=torch.uint8),
                        "measurements": torch.zeros(2, 6)})
    assert features.shape == (2, encoder.out_size)


def test_every_name_is_one_entry_of_its_own() -> None:
    assert set(ENCODERS) == {"auto", "conv_simple", "nature_cnn", "convnet_impala", "mlp",
                             "resnet_impala"}
    assert len(set(ENCODERS.values())) == len(ENCODERS)


@pytest.mark.parametrize(("name", "obs", "message"), [
    ("mlp", IMAGE, r"mlp encoder needs vectors \[D\], but observation 'obs' has shape"),
    ("nature_cnn", VECTOR, r"nature_cnn encoder needs images \[C, H, W\], but observation"),
    ("auto", ((4, 4), "float32"), "the built-in encoders take images"),
])
def test_each_name_refuses_what_it_cannot_encode(name: str, obs: tuple, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        build_encoder({"obs": obs}, ModelConfig(encoder=name))


def test_vectors_take_an_mlp_under_auto_and_mlp() -> None:
    for name in ("auto", "mlp"):
        encoder = build_encoder({"obs": VECTOR}, ModelConfig(encoder=name, mlp_layers=(8, 4)))
        assert isinstance(encoder.main, MlpEncoder) and encoder.out_size == 4
