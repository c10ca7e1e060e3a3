"""Resampling by interpolation: nearest and (bi/tri)linear, forward and backward."""
