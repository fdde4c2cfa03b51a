"""Analysis tools: parameter tables, depth/width sweeps and the learned weights of trained models."""
