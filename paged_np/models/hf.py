"""Hugging Face model directories (being written)."""

from ..errors import ModelLoadError


def load_hf(path):
    raise ModelLoadError(f"{path}: Hugging Face directories are not supported yet")
