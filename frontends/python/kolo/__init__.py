"""kolo: a collective communication runtime for data-parallel training.

``import kolo.torch as hvd`` gives Horovod's PyTorch API (docs/python.md).
"""

__version__ = "0.1.0"
