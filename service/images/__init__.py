"""Image generation: requests and events, backends' contract, and dispatch by model."""
