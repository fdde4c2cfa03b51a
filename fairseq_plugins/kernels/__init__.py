"""Optional compiled kernels for work that PyTorch's eager ops do in many memory-bound passes."""
