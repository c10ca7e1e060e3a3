"""Matrix products: batched, strided, broadcast batch, transposes, bias, activation and residual epilogues."""
