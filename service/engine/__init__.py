"""Engine processes: each loaded model in a process of its own."""
