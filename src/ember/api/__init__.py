"""The Python API: `LLM` (llama-cpp-python-shaped) and OpenAI-shaped responses."""
