"""GGUF files: read, dequantize and convert into a Hugging Face directory."""
