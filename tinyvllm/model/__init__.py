"""The model: its config, weights, tokenizer and the Llama forward pass."""
