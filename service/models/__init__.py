"""Which models exist, where their weights are, and the ones loaded now."""
