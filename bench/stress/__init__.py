"""Long runs under stress: the soak (mixed ops, no leaks) and chaos (random real faults)."""
