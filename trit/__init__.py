"""trit: ternary ({-1, 0, +1}) low-bit inference kernels and tooling.

`trit.ops` holds the packed weight layout, the torch custom ops (torch.ops.trit.*) with their
pure-torch references, and the CUDA extension loader.
"""
