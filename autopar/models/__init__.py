"""Model presets, families, and loaders for user code and transformers configs."""
from autopar.models.config import FAMILIES, ModelConfig
from autopar.models.presets import PRESETS
from autopar.models.source import ModelSource
from autopar.models.spec import load_model, parse_config

__all__ = ["FAMILIES", "PRESETS", "ModelConfig", "ModelSource", "load_model", "parse_config"]
