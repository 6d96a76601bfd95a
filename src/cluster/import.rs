//! Readers for bandwidth files written by other tools (original Pipette, mpiGraph).
