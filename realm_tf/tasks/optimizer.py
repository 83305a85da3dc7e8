"""AdamW with linear warm-up and linear decay, REALM's optimiser (Guu et al., 2020, App. A), built with
tf-models' ``official.modeling.optimization``."""
from __future__ import annotations

from official.modeling import optimization
import tf_keras

from realm_tf import config as config_lib


def build_optimizer(cfg: config_lib.TrainerConfig) -> tf_keras.optimizers.Optimizer:
    """AdamW (weight decay off for LayerNorm and biases), global-norm clipping, warm-up then linear decay."""
    opt_config = optimization.OptimizationConfig({
        "optimizer": {"type": "adamw", "adamw": {
            "weight_decay_rate": cfg.weight_decay,
            "exclude_from_weight_decay": ["LayerNorm", "layer_norm", "bias"],
            "global_clipnorm": cfg.clip_norm,
        }},
        "learning_rate": {"type": "polynomial", "polynomial": {
            "initial_learning_rate": cfg.learning_rate,
            "decay_steps": max(cfg.steps, 1),
            "end_learning_rate": 0.0,
        }},
        "warmup": {"type": "linear", "linear": {"warmup_steps": cfg.warmup_steps}},
    })
    factory = optimization.OptimizerFactory(opt_config)
    return factory.build_optimizer(factory.build_learning_rate())
