"""elmoe3d.synth."""
