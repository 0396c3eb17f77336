"""Model implementations on ForwardBatch, their config and the checkpoint loader."""

from __future__ import annotations

from sglang_pd.models.config import SUPPORTED_ARCHITECTURES, ModelConfig
from sglang_pd.models.loader import load_model

__all__ = ["SUPPORTED_ARCHITECTURES", "ModelConfig", "load_model"]
