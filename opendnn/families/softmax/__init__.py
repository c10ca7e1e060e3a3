"""Softmax forward and backward: fast, accurate and log, per instance or per channel."""
