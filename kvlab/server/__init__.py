"""llama-server and prompt models: slots, slot files, sliding-window checkpoints, prompt layout, agent history."""
