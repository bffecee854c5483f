"""Model libraries behind one interface (`base`): llama.cpp, mlx-lm, diffusers."""
