"""elmoe3d.sim."""
