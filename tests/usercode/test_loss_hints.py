"""Issue 33 item 7: a CrossEntropyLoss refused on (B, S, V) logits names launcher.losses.TokenCrossEntropy;
model_output on a model that returns a tensor (a built-in recipe's, or yours) is refused, not ignored; DeepSpeed's
ZeRO collectives' torch FutureWarnings are filtered in the rank that imports DeepSpeed."""

import re

import pytest
import torch
from torch import nn

from launcher.errors import ConfigError
from launcher.usercode.forward_check import check_model_and_loss
from tests.conftest import plan_of


class Tokens(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Embedding(11, 11)

    def forward(self, ids):
        return self.emb(ids)  # (B, S, V)


def test_cross_entropy_on_token_logits_names_the_token_loss():
    ids = torch.randint(0, 11, (2, 5))
    problems, _, _ = check_model_and_loss(Tokens(), nn.CrossEntropyLoss(), ((ids,), ids), "test", device="cpu")
    assert len(problems) == 1 and "loss={_target_: launcher.losses.TokenCrossEntropy}" in problems[0]
    assert "(2, 5, 11) logits" in problems[0] and "shift: true" in problems[0]


def test_model_output_on_a_tensor_is_refused():
    ids = torch.randint(0, 11, (2, 5))
    problems, _, _ = check_model_and_loss(Tokens(), nn.MSELoss(), ((ids,), ids), "test", model_output="logits",
                                          device="cpu")
    assert problems and problems[0].startswith("model_output=logits: the model returns a tensor (2, 5, 11)")


def test_model_output_on_a_built_in_recipe_is_refused(cpu_host):
    with pytest.raises(ConfigError, match="model_output=nope: recipe quickstart's model returns a tensor"):
        plan_of(["recipe=quickstart", "model_output=nope"], cpu_host)


def test_zero_collectives_future_warnings_are_filtered():
    from launcher.parallel.deepspeed_engine import _DEPRECATED_COLLECTIVES

    for name in ("all_gather_into_tensor", "reduce_scatter_tensor"):
        assert re.match(_DEPRECATED_COLLECTIVES, f"`torch.distributed.{name}` is deprecated. Please use ...")
    assert not re.match(_DEPRECATED_COLLECTIVES, "`torch.distributed.all_reduce` is deprecated")
