"""The NumPy backend: runs each operation's reference in its compute dtype, on the CPU."""
