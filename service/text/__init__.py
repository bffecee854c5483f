"""Text generation: what a Generate request asks for, what its stream reports, and serving it."""
