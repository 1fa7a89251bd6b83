"""Running algorithms where you can watch them: simulate (threads in one process), step,
trace, emulate (a virtual clock), invariants (theory vs run) and explain."""
