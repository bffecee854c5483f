"""The decode loop every text backend runs through, and its text handling."""
