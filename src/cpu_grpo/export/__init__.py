"""Export a run's checkpoint: HF merged, PEFT adapter, GGUF, Ollama Modelfile, and a check of what was written."""
