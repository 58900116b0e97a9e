"""Test-wide setup: without a GPU, Triton kernels run in its CPU interpreter."""

import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
