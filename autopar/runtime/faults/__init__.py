"""Faults: process groups with timeouts that name the rank (`dist`), the heartbeat that notices a frozen
or dead peer (`liveness`) and the one-line report of a rank's failure (`failures`)."""
