"""Gradient compression, as Horovod's: compress before the collective,
decompress the result."""

import torch


class Compressor:
    """Interface: compress(tensor) -> (tensor, ctx); decompress(tensor, ctx)
    -> tensor."""

    # The C++ gradient reducer's code for the same compression (None: it
    # has no equivalent, see DistributedOptimizer).
    _code = None

    @staticmethod
    def compress(tensor):
        raise NotImplementedError

    @staticmethod
    def decompress(tensor, ctx):
        raise NotImplementedError


class NoneCompressor(Compressor):
    """No compression."""

    _code = 0

    @staticmethod
    def compress(tensor):
        return tensor, None

    @staticmethod
    def decompress(tensor, ctx):
        return tensor


class _CastCompressor(Compressor):
    _wire = None

    @classmethod
    def compress(cls, tensor):
        dtype = tensor.dtype
        if tensor.is_floating_point() and \
                torch.finfo(dtype).bits > torch.finfo(cls._wire).bits:
            tensor = tensor.to(cls._wire)
        return tensor, dtype

    @staticmethod
    def decompress(tensor, ctx):
        return tensor if ctx is None or tensor.dtype == ctx else tensor.to(ctx)


class FP16Compressor(_CastCompressor):
    """Floating-point tensors travel as float16 (the runtime accumulates
    them in float); the result is cast back to the input's dtype."""

    _code = 1
    _wire = torch.float16


class BF16Compressor(_CastCompressor):
    """Floating-point tensors travel as bfloat16."""

    _code = 2
    _wire = torch.bfloat16


class Compression:
    """The compressors: Compression.none, Compression.fp16,
    Compression.bf16."""

    none = NoneCompressor
    fp16 = FP16Compressor
    bf16 = BF16Compressor
