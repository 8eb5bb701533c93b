"""Models as plain ``torch.nn.Module`` objects, behind a registry.

- :mod:`~training.models.registry`: ``register``, ``build`` (seeded), ``list_models``.
- :mod:`~training.models.zoo`: the bundled models (``mlp``, ``cnn1d``, ``simple_cnn``,
  ``lee_cnn``, ``resnet8``, ``linear``, ``transformer_lm``).
- :mod:`~training.models.checks`: the checks of a model before anything is trained
  (``check_output``, ``check_runnable``) and the context it is evaluated in (``evaluation``).
- :mod:`~training.models.features`: what the trainers and probes read of its structure.

Every name is importable from ``training.models``.
"""

from training.models.checks import (
    RECURRENT, check_model, check_output, check_runnable, evaluation, expected_output,
)
from training.models.features import activation_floats, plain_relu_mlp
from training.errors import ModelError
from training.models.registry import (
    MODELS, build, count_parameters, list_models, output_size, register, seeded,
)
from training.models.zoo import (
    SIMPLE_CNN_WIDTHS, BasicBlock, CausalSelfAttention, Flatten1dOutput, ResNet8,
    TransformerBlock, TransformerLM, cnn1d, lee_cnn, linear, mlp, resnet8, simple_cnn,
    transformer_lm,
)

__all__ = ["RECURRENT", "check_model", "check_output", "check_runnable", "evaluation",
           "expected_output", "activation_floats", "plain_relu_mlp", "ModelError", "MODELS", "build",
           "count_parameters", "list_models", "output_size", "register", "seeded",
           "SIMPLE_CNN_WIDTHS", "BasicBlock", "CausalSelfAttention", "Flatten1dOutput", "ResNet8",
           "TransformerBlock", "TransformerLM", "cnn1d", "lee_cnn", "linear", "mlp", "resnet8",
           "simple_cnn", "transformer_lm"]
