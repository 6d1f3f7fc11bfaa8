"""Online learning from simulated production traffic: feedback, shadow sampling, safe promotion."""
