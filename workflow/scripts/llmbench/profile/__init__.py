"""Module-wise profiling of one training step (paper Section IV-B/C, Tables V-VIII, XIII)."""
