"""Operations, each declared once: parameters, shape and dtype rules, NumPy reference."""
