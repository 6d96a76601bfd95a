//! Exact parameter counts of a Megatron GPT model.
