"""Weight formats: the table of formats with the containers that keep a matrix in its format
(`table`), and the numpy block functions that read a block's values and fields (`dequantize`).

Invariant: a weight keeps the exact values its checkpoint stores; every Python fact about a
format is in its row of the table and nowhere else.
"""

from exactdraft.formats.table import (
    BLOCK_FORMATS,
    FORMATS,
    AffineQuantizedTensor,
    QuantizedTensor,
    StackedWeight,
    WeightFormat,
    affine_from_blocks,
    format_for_ggml_type,
    stack_rows,
    weight_format,
)

__all__ = ["BLOCK_FORMATS", "FORMATS", "AffineQuantizedTensor", "QuantizedTensor",
           "StackedWeight", "WeightFormat", "affine_from_blocks", "format_for_ggml_type",
           "stack_rows", "weight_format"]
