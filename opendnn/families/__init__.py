"""Operation families: one folder per family holds its problem, backends, calls and samples."""
