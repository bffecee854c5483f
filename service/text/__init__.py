"""Text generation: what a Generate request asks for, what its stream reports, and how its
messages become a prompt (the model's chat template, the clients' text kept as text)."""
