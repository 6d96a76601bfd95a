//! Named models for use without a script (`--model NAME`).
