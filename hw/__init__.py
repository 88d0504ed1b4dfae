"""elmoe3d.hw."""
